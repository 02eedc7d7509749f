"""Disk full: a local checkpoint save that runs out of space ends with one clear line, exit 2, and leaves
the previous verified checkpoint and the pointer untouched.

The full disk is real: a size-limited tmpfs mounted over the run's local checkpoint folder, so the kernel
answers ENOSPC part-way through a file. As root the test mounts it directly; otherwise it runs the session
inside a private user and mount namespace (``unshare -rm``), where an unprivileged user may mount tmpfs.
Where neither is possible the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = 4096


def _pages(n: int) -> int:
    return -(-n // PAGE)


def _run_on_small_disk(zygote, argv: list[str], mount_at: Path, size: int, out: Path, env: dict):
    """Run `baton argv` with a tmpfs of ``size`` bytes at ``mount_at``. Returns (status, stderr, files left there)."""
    mount_at.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_at)], capture_output=True)
        if m.returncode == 0:
            try:
                r = zygote.run(argv, out, timeout=120)
                left = sorted(p.relative_to(mount_at).as_posix() for p in mount_at.rglob("*"))
            finally:
                subprocess.run(["umount", str(mount_at)], check=True)
            return r.returncode, r.stderr, left
    listing = out / "left.txt"
    with open(listing, "w") as fd:
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "baton.cli", *argv])
        where = shlex.quote(str(mount_at))
        script = (f"mount -t tmpfs -o size={size} tmpfs {where} || exit 97; {cmd}; rc=$?; "
                  f"(cd {where} && find . -mindepth 1) >&{fd.fileno()}; exit $rc")
        p = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                           capture_output=True, text=True, env={**os.environ, **env}, pass_fds=(fd.fileno(),),
                           timeout=300)
    if p.returncode == 97 or (p.returncode == 1 and "unshare" in p.stderr):
        pytest.skip(f"cannot mount a size-limited tmpfs here (not root, no user namespaces): {p.stderr[-300:]}")
    left = sorted(line.strip()[2:] for line in listing.read_text().splitlines() if line.strip())
    return p.returncode, p.stderr, left


@pytest.mark.parametrize("where", ["weights", "state"])
def test_a_full_local_disk_stops_cleanly_and_keeps_the_baton(where, zygote, fake_env, make_config, tmp_path):
    cfg = make_config()
    store, runs = tmp_path / "store", tmp_path / "runs"
    argv = ["train", "-c", str(cfg), "--no-progress"]
    first = zygote.run(argv + ["--stop-after-steps", "4"], tmp_path / "out")
    assert first.returncode == 0, first.stderr[-3000:]
    pointer_before = (store / "test" / "latest.json").read_bytes()
    ckpt = store / "test" / "ckpt" / "step-4"
    stored = {p.name: p.read_bytes() for p in ckpt.iterdir()}

    # The disk is cut to size from the checkpoint just made (the next one has the same tensors): half the
    # weights file, or the weights and moments with one page to spare, so the save fails in safetensors'
    # writer or in the state file after it.
    if where == "weights":
        size = _pages(len(stored["model.safetensors"])) // 2 * PAGE
    else:
        size = (_pages(len(stored["model.safetensors"])) + _pages(len(stored["optimizer.safetensors"])) + 1) * PAGE
        assert len(stored["state.json"]) > PAGE
    status, stderr, left = _run_on_small_disk(zygote, argv + ["--stop-after-steps", "6"], runs / "test" / "ckpt", size,
                                              tmp_path / "out", fake_env)

    assert status == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("baton: error:")]
    assert errors == [f"baton: error: no space left on the disk of {runs / 'test' / 'ckpt'} to write checkpoint "
                      "step-6 (free space there, or set run.local_dir to a larger disk, then resume); nothing was "
                      "pushed and the pointer still names the previous verified checkpoint"]
    assert left == [], "the half-written checkpoint must be removed to give the space back"
    # The baton is untouched: the same pointer, the same verified checkpoint, byte for byte.
    assert (store / "test" / "latest.json").read_bytes() == pointer_before
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == stored
    assert not (store / "test" / "ckpt" / "step-6").exists()

    # With the space back, the next session resumes from step 4 and goes on.
    again = zygote.run(argv + ["--stop-after-steps", "6"], tmp_path / "out")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed at step 4" in again.stderr
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 6
