"""Disk full: a local checkpoint save that runs out of space ends with one clear line, exit 2, and leaves
the previous verified checkpoint and the pointer untouched.

The full disk is real: a size-limited tmpfs mounted over the run's local checkpoint folder, so the kernel
answers ENOSPC part-way through a file. As root the test mounts it directly; otherwise it runs the session
inside a private user and mount namespace (``unshare -rm``), where an unprivileged user may mount tmpfs.
Where neither is possible the test is skipped and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = 4096


def _pages(n: int) -> int:
    return -(-n // PAGE)


def _run_on_small_disk(zygote, argv: list[str], mount_at: Path, size: int, out: Path, env: dict,
                       python: str | None = None):
    """Run `baton argv` (or ``python -c <python> argv`` when given) with a tmpfs of ``size`` bytes at
    ``mount_at``. Returns (status, stderr, files left there)."""
    mount_at.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "baton.cli", *argv] if python is None else [sys.executable, "-c", python, *argv]
    if os.geteuid() == 0:
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_at)], capture_output=True)
        if m.returncode == 0:
            try:
                if python is None:
                    r = zygote.run(argv, out, timeout=120)
                else:
                    r = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
                left = sorted(p.relative_to(mount_at).as_posix() for p in mount_at.rglob("*"))
            finally:
                subprocess.run(["umount", str(mount_at)], check=True)
            return r.returncode, r.stderr, left
    listing = out / "left.txt"
    with open(listing, "w") as fd:
        cmd = " ".join(shlex.quote(a) for a in command)
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


def _four_steps(zygote, make_config, tmp_path: Path) -> tuple[list[str], Path, Path, bytes]:
    """Train the test run to a verified checkpoint at step 4. Returns (argv, store, runs, pointer bytes)."""
    store, runs = tmp_path / "store", tmp_path / "runs"
    argv = ["train", "-c", str(make_config()), "--no-progress"]
    first = zygote.run(argv + ["--stop-after-steps", "4"], tmp_path / "out")
    assert first.returncode == 0, first.stderr[-3000:]
    return argv, store, runs, (store / "test" / "latest.json").read_bytes()


@pytest.mark.parametrize("where", ["weights", "state"])
def test_a_full_local_disk_stops_cleanly_and_keeps_the_baton(where, zygote, fake_env, make_config, tmp_path):
    argv, store, runs, pointer_before = _four_steps(zygote, make_config, tmp_path)
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
                      "pushed; the pointer still names the verified checkpoint at step 4"]
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


def _local_save_fails(runs: Path, step: int) -> None:
    """The local save of checkpoint ``step`` will fail: a file stands where its half-written folder goes."""
    (runs / "test" / "ckpt").mkdir(parents=True, exist_ok=True)
    (runs / "test" / "ckpt" / f"step-{step}.partial").write_text("in the way")


@pytest.mark.parametrize("start", ["fresh", "resume-path"])
def test_a_failed_local_save_says_what_the_pointer_names(start, make_config, tmp_path, capsys):
    """Before any pointer exists, and after --resume PATH (which never reads the pointer), a local save that
    fails must not claim that the pointer names a previous verified checkpoint."""
    from support.boundary import assert_input_error, run_in_process

    cfg, store, runs = make_config(), tmp_path / "store", tmp_path / "runs"
    argv = ["train", "-c", str(cfg), "--no-progress"]
    if start == "fresh":
        held = "the store holds no verified checkpoint of this run yet (no pointer was written)"
    else:
        assert run_in_process(argv + ["--stop-after-steps", "1"], capsys).status == 0
        shutil.copytree(store / "test" / "ckpt" / "step-1", tmp_path / "copy")
        argv += ["--resume", str(tmp_path / "copy")]
        held = "the store's pointer was not moved"
    pointer = (store / "test" / "latest.json").read_bytes() if start != "fresh" else None
    _local_save_fails(runs, 2)
    line = assert_input_error(run_in_process(argv + ["--stop-after-steps", "2"], capsys))
    assert line == (f"baton: error: could not write checkpoint step-2 to {runs / 'test' / 'ckpt'}: File exists (check "
                    f"that run.local_dir is writable, then resume); nothing was pushed; {held}"), line
    assert "previous" not in line
    if pointer is None:
        assert not (store / "test" / "latest.json").exists()
    else:
        assert (store / "test" / "latest.json").read_bytes() == pointer


def test_a_resume_that_cannot_fit_on_the_local_disk_says_so_before_downloading(zygote, fake_env, make_config,
                                                                               tmp_path):
    argv, store, runs, pointer_before = _four_steps(zygote, make_config, tmp_path)
    shutil.rmtree(runs / "test" / "ckpt")  # a new machine: nothing local, everything comes from the store
    need = sum(p.stat().st_size for p in (store / "test" / "ckpt" / "step-4").iterdir())

    status, stderr, left = _run_on_small_disk(zygote, argv + ["--stop-after-steps", "6"], runs / "test" / "resume",
                                              need // 2, tmp_path / "out", fake_env)

    assert status == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("baton: error:")]
    assert len(errors) == 1, stderr[-3000:]
    assert re.fullmatch(rf"baton: error: checkpoint ckpt/step-4 needs [\d.,]+ MiB but the disk of "
                        rf"{re.escape(str(runs / 'test' / 'resume'))} has [\d.,]+ MiB free \(free space there or set "
                        r"run.local_dir to a larger disk, then rerun\); the store is untouched", errors[0]), errors[0]
    assert "starting fresh" not in stderr.lower()
    assert (store / "test" / "latest.json").read_bytes() == pointer_before


# A download that overflows the disk part-way (the space went to something else after the check).
GET = """
import sys
from pathlib import Path
from baton.errors import LocalDiskError
from baton.store import open_store
store = open_store(sys.argv[1])
try:
    store.get_file(sys.argv[2], Path(sys.argv[3]))
except LocalDiskError as e:
    print(f"LocalDiskError: {e}", file=sys.stderr)
    sys.exit(3)
"""


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_download_that_fills_the_local_disk_blames_this_disk_not_the_store(backend, zygote, fake_env, moto,
                                                                             s3_bucket, tmp_path):
    blob = os.urandom(3 * 2**20)
    if backend == "local":
        (tmp_path / "store" / "run").mkdir(parents=True)
        (tmp_path / "store" / "run" / "big.bin").write_bytes(blob)
        url = str(tmp_path / "store")
    else:
        from baton.store import open_store

        url = f"s3://{s3_bucket()}/p?endpoint={moto.url}"
        (tmp_path / "big.bin").write_bytes(blob)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in fake_env.items():
                mp.setenv(k, v)
            open_store(url).put_file(tmp_path / "big.bin", "run/big.bin", hashlib.sha256(blob).hexdigest())
    disk = tmp_path / "small"
    status, stderr, left = _run_on_small_disk(zygote, [url, "run/big.bin", str(disk / "big.bin")], disk, 2**20,
                                              tmp_path / "out", fake_env, python=GET)

    # Not retried as if the store were down, and not reported as the store's fault: one error naming this
    # disk, and no half file that could pass for a whole one.
    assert status == 3, stderr[-3000:]
    assert stderr.strip() == (f"LocalDiskError: no space left on this machine's disk writing {disk / 'big.bin'} "
                              "(free space there or set run.local_dir to a larger disk, then rerun)")
    assert left == []
