"""Publishing a run as a Hugging Face model repository on the local Hub server, read back with the unmodified
client: the model at the root loads and generates, the card parses and carries the run's numbers, an
interrupted publish is finished by a rerun without ever showing a card over unverified files, and bad input
stops before any upload. `baton eval --step N` scores any verified checkpoint as the run scored it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, snapshot_download
from store_backends import FAST_RETRY, HubBackend

from helpers import write_config

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "loss_curve.png"}


def hub_env(b: HubBackend) -> dict[str, str]:
    return {"HF_ENDPOINT": b.proxy.url, "HF_TOKEN": b.hub.token, "HF_HUB_DISABLE_XET": "1"}


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "baton.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.fixture(scope="module")
def published(tmp_path_factory, prepared_data, hub_server):
    """One 20-step run with publish.url on the Hub server and publish.every=10: checkpoints 10 and 20 kept."""
    base = tmp_path_factory.mktemp("published")
    b = HubBackend(hub_server, FAST_RETRY)
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    r = cli("train", "-c", str(cfg), "--no-progress", "--set", "train.ckpt_every=10", "--set", "store.keep_last=4",
            "--set", f"publish.url=hf://{b.repo}", "--set", "publish.every=10", env=hub_env(b))
    assert r.returncode == 0, r.stderr
    yield b, cfg, base
    b.close()


def download(b: HubBackend, dest: Path, revision: str | None = None) -> Path:
    return Path(snapshot_download(b.repo, endpoint=b.hub.url, token=b.hub.token, revision=revision,
                                  cache_dir=dest / "cache", local_dir=dest / "model"))


def results(card: ModelCard) -> dict[tuple[str, str], float]:
    return {(r.dataset_type, r.metric_type): r.metric_value for r in card.data.eval_results}


def test_horizon_publishes_a_loadable_model_whose_card_holds_the_run(published, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    b, cfg, base = published
    summary = json.loads((base / "runs" / "test" / "run_summary.json").read_text())
    folder = download(b, tmp_path)
    assert MODEL_FILES | {"README.md"} <= {p.name for p in folder.iterdir()}
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == summary["params"]
    out = pipeline("text-generation", model=str(folder))("def ", max_new_tokens=8, do_sample=False)
    assert out[0]["generated_text"].startswith("def ") and len(out[0]["generated_text"]) > 4

    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and card.data.license == "apache-2.0"
    assert "baton" in card.data.tags
    record = json.loads((base / "store" / "test" / "eval" / "20.json").read_text())
    got = results(card)
    assert abs(got[("baton-heldout", "loss")] - summary["val_loss"]) < 1e-6
    assert got[("baton-heldout", "bits_per_byte")] == round(record["heldout"]["bits_per_byte"], 6)
    assert record["tokens_seen"] == summary["tokens_consumed"]
    for number in (f"{summary['params']:,}", f"{summary['tokens_consumed']:,}"):
        assert number in card.text
    manifest = json.loads((Path(summary["config"]["data"]["dir"]) / "manifest.json").read_text())
    assert manifest["fingerprint"] in card.text and "![training loss](loss_curve.png)" in card.text

    # publish.every=10: step 10 is the branch step-10, with its own card
    branch = download(b, tmp_path / "rev", revision="step-10")
    card10 = ModelCard.load(branch / "README.md")
    assert "step 10" in card10.text and MODEL_FILES <= {p.name for p in branch.iterdir()}
    assert b.hub.read(b.repo, "model.safetensors", "step-10") != b.hub.read(b.repo, "model.safetensors")


def test_eval_of_any_verified_step_scores_as_the_run_did(published, tmp_path):
    """eval --step 20 gives the run's own final held-out loss; eval --step 10 gives what transformers computes on
    the export of step 10 over the same windows (to 1e-4)."""
    from transformers import AutoModelForCausalLM

    from baton.config import load_config
    from baton.data.reader import WindowDataset
    from baton.evaluation import run_eval
    from baton.export import export_run

    b, cfg, base = published
    summary = json.loads((base / "runs" / "test" / "run_summary.json").read_text())
    c = load_config(cfg)
    final, _ = run_eval(c, step=20, files=[], tasks=[])
    assert abs(final["heldout"]["loss"] - summary["val_loss"]) < 1e-4
    early, key = run_eval(c, step=10, files=[], tasks=[])
    assert key == "test/eval/10.json" and json.loads((base / "store" / key).read_text()) == early

    out = export_run(c, "store", tmp_path / "step10", step=10)
    assert json.loads((out / "baton.json").read_text())["step"] == 10
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ds = WindowDataset(c.data.dir, c.data.seq_len, c.data.shuffle_seed, c.data.val_windows)
    with torch.no_grad():
        losses = [float(model(input_ids=r[None], labels=r[None]).loss) for r in ds.rows(ds.val_window_ids())]
    assert abs(sum(losses) / len(losses) - early["heldout"]["loss"]) < 1e-4
    assert early["heldout"]["loss"] > final["heldout"]["loss"]


def store_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_interrupted_publish_is_finished_by_a_rerun(published, hub_server, tmp_path):
    """SIGKILL after the files are verified, before the card; then a store failing mid-upload of a new step over
    a published one: no card is ever shown over files it does not name, a rerun finishes, the store is untouched."""
    from baton.config import load_config
    from baton.errors import StoreError
    from baton.publish import publish

    _, cfg, base = published
    b = HubBackend(hub_server, FAST_RETRY)
    try:
        env = hub_env(b)
        before = store_digest(base / "store" / "test")
        trace = tmp_path / "trace"
        proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "publish", "-c", str(cfg), "--step", "10",
                                 "--set", f"publish.url=hf://{b.repo}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **env, "BATON_FAULT_TRACE": str(trace),
                                     "BATON_FAULT_PAUSE": "publish.card=60"})
        deadline = time.time() + 120
        while not (trace.is_file() and "publish.card" in trace.read_text()):
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        files = b.hub.files(b.repo)
        assert MODEL_FILES <= set(files) and "README.md" not in files

        r = cli("publish", "-c", str(cfg), "--step", "10", "--set", f"publish.url=hf://{b.repo}", env=env)
        assert r.returncode == 0, r.stderr
        assert "step 10" in b.hub.read(b.repo, "README.md").decode()
        ten = b.hub.read(b.repo, "model.safetensors")

        # Step 20 over the published step 10, with the store failing every weight upload: the old card goes
        # first, so the root never shows step 10's card over step 20's files, nor a card over unverified ones.
        c = load_config(cfg, [f"publish.url=hf://{b.repo}", "store.retries=2", "store.retry_seconds=1"])
        os.environ.update(env)  # the client reads the endpoint and token from the environment, as in production
        commits: list[str] = []

        def upload_commit(method: str, path: str) -> bool:  # the card's removal is commit 1; the files' is 2
            if method == "POST" and "/commit/" in path:
                commits.append(path)
                return len(commits) > 1
            return False

        b.fault("status", status=500, match=upload_commit)
        with pytest.raises(StoreError):
            publish(c, 20)
        assert "README.md" not in b.hub.files(b.repo) and b.hub.read(b.repo, "model.safetensors") == ten
        b.clear_faults()
        out = publish(c, 20)
        assert out["step"] == 20 and "step 20" in b.hub.read(b.repo, "README.md").decode()
        assert b.hub.read(b.repo, "model.safetensors") != ten
        assert store_digest(base / "store" / "test") == before
    finally:
        for k in ("HF_ENDPOINT", "HF_TOKEN"):
            os.environ.pop(k, None)
        b.close()


def test_bad_publish_input_is_one_line_before_any_upload(published, hub_server, tmp_path):
    _, cfg, _ = published
    b = HubBackend(hub_server, FAST_RETRY)
    try:
        url = ["--set", f"publish.url=hf://{b.repo}"]
        cases = [
            (["publish", "-c", str(cfg), *url], {**hub_env(b), "HF_TOKEN": "hf_wrong_token_0123"}, "rejected the token"),
            (["publish", "-c", str(cfg), "--set", "publish.url=ftp://host/m"], hub_env(b), "publish.url ftp://"),
            (["publish", "-c", str(cfg), *url, "--step", "7"], hub_env(b), "step 7 is not a verified checkpoint"),
            (["eval", "-c", str(cfg), "--step", "7"], {}, "step 7 is not a verified checkpoint"),
            (["export", "-c", str(cfg), "--step", "7", "--out", str(tmp_path / "x")], {}, "step 7 is not"),
            (["publish", "-c", str(cfg), "--set", "publish.url=hf://baton-test/no-such-repo"], hub_env(b),
             "was not found"),
        ]
        for args, env, said in cases:
            r = cli(*args, env=env)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and said in lines[0], (args, r.stderr)
            assert lines[0].startswith("baton: error: ")
        assert b.hub.files(b.repo) == {} and not any(s.method in ("PUT", "POST") for s in b.proxy.seen)
    finally:
        b.close()
