"""Without the optional tracker packages: training works, and asking for one is one line and exit 2 at start.

The environment is real: a site folder holding every installed package except wandb, mlflow and
tensorboard, with the interpreter's own site-packages switched off (-S).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from baton.config import load_config
from support.helpers import read_metrics

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("wandb", "mlflow", "mlflow_skinny", "tensorboard", "tensorboard_data_server")


def _site_without_trackers(dest: Path) -> Path:
    dest.mkdir()
    for sp in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(sp).iterdir():
            if entry.name.split("-")[0].split(".")[0].lower() in OPTIONAL or (dest / entry.name).exists():
                continue
            (dest / entry.name).symlink_to(entry)
    return dest


def test_training_without_tracker_packages_and_a_clear_error_when_one_is_asked_for(make_config, tmp_path):
    cfg = make_config()
    site = _site_without_trackers(tmp_path / "site")
    env = {"PYTHONPATH": f"{ROOT}:{site}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", "-m", "baton.cli", "train", "-c", str(cfg), "--no-progress", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    r = train("--set", 'log.backends=["jsonl","wandb"]')
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "baton: error: log.backends asks for wandb, but the 'wandb' package is not installed "
        '(pip install "baton[wandb]", or remove \'wandb\' from log.backends)']
    run_dir = load_config(cfg).run_dir
    assert not (run_dir / "metrics.jsonl").exists() and not (tmp_path / "store").exists()  # nothing started

    r = train("--stop-after-steps", "3")  # the default: metrics.jsonl only
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3]
    assert "No module named" not in r.stderr
