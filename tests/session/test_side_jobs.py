"""What a session does on the side never stops it, whatever goes wrong there; what it must check first, it
checks before anything is written; and a resumed session knows the run's newest validation."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baton.cli import main
from baton.errors import StoreError
from baton.session.sidejobs import soft

ROOT = Path(__file__).resolve().parents[2]
# Every kind of failure a side job may meet: a store's, the file system's, an optional library's own, a bug.
FAILURES = [StoreError("the store said 503"), OSError(28, "No space left on device"),
            ValueError("If `source_name` is provided, `source_url` must be provided too"),
            KeyError("heldout"), RuntimeError("CUDA error: an illegal memory access"), ImportError("no module x")]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_a_side_job_turns_any_failure_into_one_warning(failure, caplog):
    def job():
        raise failure

    with caplog.at_level(logging.WARNING):
        assert soft("publishing step 4 as revision step-4", "`baton publish --step 4` retries it", job) is None
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"publishing step 4 as revision step-4 failed ({type(failure).__name__}: ")
    assert line.endswith("training goes on: `baton publish --step 4` retries it") and "\n" not in line


def test_publish_every_failing_in_every_way_never_stops_training(make_config, tmp_path, monkeypatch, capfd):
    """Each publish point fails with another kind of exception; the run trains to its horizon all the same."""
    import baton.release.publish as pub

    kinds = iter(FAILURES)
    calls = []

    def failing(cfg, step, revision=None):
        calls.append((step, revision))
        raise next(kinds)

    monkeypatch.setattr(pub, "publish", failing)
    cfg = str(make_config())
    assert main(["train", "-c", cfg, "--no-progress", "--set", "train.steps=12", "--set", "train.ckpt_every=2",
                 "--set", f"publish.url={tmp_path / 'published'}", "--set", "publish.every=2"]) == 0
    assert calls == [(s, f"step-{s}") for s in (2, 4, 6, 8, 10)]
    warned = [line for line in capfd.readouterr().err.splitlines() if " as revision step-" in line]
    assert [w.split(" failed (")[1].split(":")[0] for w in warned] == [type(e).__name__ for e in FAILURES[:5]]
    pointer = json.loads((tmp_path / "store" / "test" / "latest.json").read_text())
    assert pointer["complete"] and pointer["step"] == 12


def test_the_model_card_names_lm_eval_with_its_source():
    """huggingface_hub refuses an evaluation result whose source has a name but no URL."""
    from baton.evaluate.record import EvalRecord
    from baton.release.modelcard import LM_EVAL_URL, _results

    ev = EvalRecord(run="r", step=4, tokens_seen=64, heldout={"loss": 2.0}, tasks={"hellaswag": {"acc": 0.25}})
    results = _results("me/model", ev)
    assert [(r.dataset_type, r.metric_type, r.source_url) for r in results][-1] == ("hellaswag", "acc", LM_EVAL_URL)


def test_a_tracker_package_that_fails_on_import_is_refused_before_anything_is_written(make_config, tmp_path):
    broken = tmp_path / "site" / "mlflow"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('cannot import name X from partially initialized y')\n")
    cfg = make_config()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    p = subprocess.run([sys.executable, "-m", "baton.cli", "train", "-c", str(cfg), "--no-progress", "--set",
                        'log.backends=["mlflow"]'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, p.stderr[-3000:]
    [line] = p.stderr.strip().splitlines()
    assert line.startswith("baton: error: log.backends asks for mlflow, but the installed 'mlflow' package fails on "
                           "import (ImportError: cannot import name X") and "remove 'mlflow' from log.backends" in line
    assert not (tmp_path / "store").exists()  # no ledger record, no pointer: nothing was written


def test_a_resumed_session_that_validates_nothing_reports_the_newest_validation(make_config, tmp_path):
    cfg = str(make_config())
    runs = tmp_path / "runs"
    common = ["train", "-c", cfg, "--no-progress", "--set", "train.eval_every=4", "--set", "train.ckpt_every=4"]
    assert main([*common, "--stop-after-steps", "9"]) == 0  # validates at 4 and 8, checkpoints at 4, 8 and 9
    assert main([*common, "--stop-after-steps", "11"]) == 0  # resumes at 9, validates nothing
    rows = [json.loads(x) for x in (runs / "test" / "metrics.jsonl").read_text().splitlines()]
    row8 = next(r for r in rows if r["step"] == 8)
    summary = json.loads((runs / "test" / "run_summary.json").read_text())
    assert summary["resumed_from_step"] == 9 and summary["steps_done"] == 11
    assert (summary["val_step"], summary["val_loss"], summary["val_ppl"]) == (8, row8["val_loss"], row8["val_ppl"])
