"""Training sessions against the S3 server: resume from S3 alone is exact, a SIGKILL during an upload leaves
the pointer on the last verified checkpoint, and a background push that fails stops every rank."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from safetensors.torch import load

from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors, write_config

CADENCE = ["--set", "train.ckpt_every=4", "--no-progress"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared_data, baton_cli):
    """The uninterrupted run (local store): its final model and optimizer tensors."""
    base = tmp_path_factory.mktemp("reference")
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    r = baton_cli("train", "-c", str(cfg), *CADENCE)
    assert r.returncode == 0, r.stderr
    model, optim, pointer = store_checkpoint_tensors(base / "store", "test")
    assert pointer["step"] == 20 and pointer["complete"]
    return model, optim


def s3_checkpoint(backend):
    pointer = json.loads(backend.raw("test/latest.json"))
    model = load(backend.raw(f"test/{pointer['path']}/model.safetensors"))
    optim = load(backend.raw(f"test/{pointer['path']}/optimizer.safetensors"))
    return model, optim, pointer


def kill_during_upload(baton_cli, backend, cfg: str, url: list[str], step: int, run_dir: Path) -> None:
    """Train until the upload of checkpoint ``step`` is on the wire (slowed down by the proxy) and training has
    gone on past it (the push runs in the background), then SIGKILL."""
    backend.fault("slow", match=lambda m, p: m == "PUT" and f"/ckpt/step-{step}/" in p, slow_seconds_per_mb=40)
    proc = baton_cli.start("train", "-c", cfg, *url, *CADENCE)
    deadline = time.time() + 180

    def upload():
        return next((s for s in backend.proxy.seen
                     if s.method == "PUT" and f"/ckpt/step-{step}/model.safetensors" in s.path), None)

    def trained() -> int:
        try:
            return max((r["step"] for r in read_metrics(run_dir)), default=0)
        except (OSError, ValueError):
            return 0

    while upload() is None or trained() < step + 2:
        assert proc.poll() is None, "the run ended before its upload could be killed: " + proc.stderr_text()
        assert time.time() < deadline
        time.sleep(0.01)
    assert upload().status is None, "the upload should still be on the wire while training went on"
    proc.kill(signal.SIGKILL)
    assert proc.wait(timeout=30).returncode == -signal.SIGKILL
    backend.clear_faults()


def test_stop_wipe_resume_from_s3_alone_and_sigkill_mid_upload(reference, make_backend, make_config, baton_cli,
                                                              tmp_path):
    """Stop at 10, wipe, resume from S3 alone; SIGKILL during the step-16 upload; resume; finish: the final
    weights equal the uninterrupted run's exactly, and the pointer never named an unverified checkpoint."""
    backend = make_backend("s3")
    cfg = str(make_config())
    url = ["--set", f"store.url={backend.url}"]

    leg1 = baton_cli("train", "-c", cfg, *url, *CADENCE, "--stop-after-steps", "10")
    assert leg1.returncode == 0, leg1.stderr
    assert f"no checkpoint pointer test/latest.json in {backend.store.describe()}: starting run 'test' at step 0" \
        in leg1.stderr
    assert s3_checkpoint(backend)[2]["step"] == 10
    shutil.rmtree(tmp_path / "runs")  # a new machine: only the S3 store survives

    # Resumes at 10 from S3 alone; checkpoints 12 (verified) and 16 (killed while uploading).
    kill_during_upload(baton_cli, backend, cfg, url, 16, tmp_path / "runs" / "test")
    _, _, pointer = s3_checkpoint(backend)
    assert pointer["step"] == 12, "the pointer may only name a verified checkpoint"
    for name, info in pointer["files"].items():  # and every byte it names is there
        data = backend.raw(f"test/{pointer['path']}/{name}")
        assert len(data) == info["size"] and hashlib.sha256(data).hexdigest() == info["sha256"]
    shutil.rmtree(tmp_path / "runs")

    leg3 = baton_cli("train", "-c", cfg, *url, *CADENCE)
    assert leg3.returncode == 0, leg3.stderr
    assert "auto-resume" in leg3.stderr and "says step 12" in leg3.stderr
    model, optim, pointer = s3_checkpoint(backend)
    assert pointer["step"] == 20 and pointer["complete"] and pointer["final"]["path"] == "final"
    assert_tensors_equal(model, reference[0])
    assert_tensors_equal(optim, reference[1])
    # keep_last=2 verified checkpoints (the killed step-16 upload was replaced), and the exported model
    steps = {k.split("/")[2] for k in backend.store.list("test/ckpt/", checksums=False)}
    assert steps == {"step-16", "step-20"}
    assert "test/final/model.safetensors" in backend.store.list("test/final/", checksums=False)
    for text in (leg1.stderr, leg3.stderr, (tmp_path / "runs" / "test" / "run_summary.json").read_text()):
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text and os.environ["AWS_ACCESS_KEY_ID"] not in text


def test_failed_background_push_stops_every_rank_at_the_next_boundary(make_backend, make_config, baton_cli, tmp_path):
    backend = make_backend("s3")
    cfg = str(make_config())
    backend.fault("status", status=503, match=lambda m, p: m == "PUT" and "/ckpt/step-8/" in p)
    r = baton_cli("train", "-c", cfg, "--set", f"store.url={backend.url}", *CADENCE, "--set", "store.retries=2",
            "--nproc", "2")
    assert r.returncode != 0
    assert f"checkpoint at step 8 was not verified in {backend.store.describe()}" in r.stderr
    assert "HTTP 503 ServiceUnavailable" in r.stderr and "after 2 attempt(s)" in r.stderr
    run_dir = tmp_path / "runs" / "test"
    for rank in (0, 1):  # every rank learned it and failed with the same error
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "checkpoint at step 8 was not verified" in log, f"rank {rank}"
    steps = [row["step"] for row in read_metrics(run_dir)]
    assert 8 <= max(steps) < 20, "training stops at a step boundary soon after the failure, not at the horizon"
    kept = run_dir / "ckpt" / "step-8"
    assert sorted(p.name for p in kept.iterdir()) == ["metrics.jsonl", "model.safetensors", "optimizer.safetensors",
                                                      "state.json"]
    assert json.loads(backend.raw("test/latest.json"))["step"] == 4
