"""The embedded default, exactly as `make demo` runs it: real config, real corpus, full horizon, each command
in a fresh interpreter."""

import json
import math
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The full default run takes minutes on a quiet machine; the ceiling only catches a hang, never a slow machine.
HANG_S = 3600


@pytest.mark.slow
def test_tiny_default_trains_to_a_useful_loss_and_a_rerun_finds_it_complete(tmp_path, baton_cli):
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "tiny.toml", tmp_path / "configs" / "tiny.toml")

    # One torch thread: the suite's other worker shares the cores, and a thread per core beside it makes
    # every parallel region wait for a descheduled thread (minutes more on a busy machine). The config and
    # the command are make demo's.
    def demo(command: str):
        return baton_cli(command, "-c", "configs/tiny.toml", "--no-progress", cwd=tmp_path, check=True,
                         timeout=HANG_S, fresh=True, env={"OMP_NUM_THREADS": "1"})

    demo("prepare")
    first = demo("train")
    assert "starting run 'tiny' at step 0" in first.stderr

    summary = json.loads((tmp_path / "runs" / "tiny" / "run_summary.json").read_text())
    vocab = json.loads((tmp_path / "data" / "tiny" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert summary["steps_done"] == summary["total_steps"] == 100
    assert summary["val_loss"] <= math.log(vocab) - 2.0, summary["val_loss"]
    pointer = json.loads((tmp_path / "store" / "tiny" / "latest.json").read_text())
    assert pointer["complete"] and pointer["step"] == 100 and pointer["final"]["path"] == "final"

    again = demo("train")
    assert "is complete" in again.stderr and "Nothing to do" in again.stderr
    assert "train tiny" not in again.stderr  # no training progress at all
    assert json.loads((tmp_path / "runs" / "tiny" / "run_summary.json").read_text()) == summary
