"""An interrupted prepare (SIGKILL, twice, once with a torn journal line) continues to the same bytes."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import time
from pathlib import Path

from baton.config import load_config
from baton.data.journal import JOURNAL
from baton.data.prepare import prepare
from support.kills import kill_when
from support.mixdata import write_mix_config

ROOT = Path(__file__).resolve().parents[2]


def _prepare_cmd(cfg: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "baton.cli", "prepare", "-c", str(cfg), "--no-progress",
            "--set", f"data.prepare_workers={workers}"]


def _kill_after(cfg: Path, journal: Path, records: int, workers: int) -> int:
    """Start a prepare, SIGKILL it once the journal holds ``records`` shard lines; return the lines seen."""
    group = kill_when(_prepare_cmd(cfg, workers),
                      lambda: journal.is_file() and journal.read_bytes().count(b"\n") >= records + 1, ROOT)
    # The encoding workers notice their parent is gone and exit on their own.
    deadline = time.time() + 20
    while time.time() < deadline and _group_alive(group):
        time.sleep(0.1)
    assert not _group_alive(group), "worker processes outlived the killed prepare"
    return journal.read_bytes().count(b"\n") - 1


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigkill_and_rerun_gives_the_bytes_of_an_uninterrupted_prepare(tmp_path, mix_paths):
    data = {"shard_tokens": 2000}
    reference = write_mix_config(tmp_path / "ref.toml", tmp_path / "ref", mix_paths, data=data)
    prepare(load_config(reference), progress=False)

    cfg = write_mix_config(tmp_path / "cut.toml", tmp_path / "cut", mix_paths, data=data)
    folder = tmp_path / "cut"
    journal = folder / JOURNAL
    first = _kill_after(cfg, journal, 3, workers=2)  # the pool path: its workers must not linger
    assert first >= 3 and not (folder / "manifest.json").exists()
    tok = (folder / "tokenizer.json").stat()
    second = _kill_after(cfg, journal, first + 8, workers=1)
    assert second >= first + 8
    kept = {f"shard-{i:05d}.bin": (folder / f"shard-{i:05d}.bin").stat() for i in range(second)}
    with open(journal, "ab") as f:  # a record torn mid-write: ignored, its shard written again
        f.write(b'{"resume": {"acct": [{"docu')
    done = subprocess.run(_prepare_cmd(cfg, 1), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"continuing an interrupted prepare in {folder} at shard {second}" in done.stderr
    assert "training a byte-level BPE" not in done.stderr  # the tokenizer is reused, not retrained
    after = (folder / "tokenizer.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (tok.st_ino, tok.st_mtime_ns)
    for name, st in kept.items():  # finished shards are kept, not written again
        now = (folder / name).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), name

    names = sorted(p.name for p in (tmp_path / "ref").iterdir())
    assert names == sorted(p.name for p in folder.iterdir())  # journal gone, no leftovers
    assert len(names) > 20
    for name in names:
        assert filecmp.cmp(tmp_path / "ref" / name, folder / name, shallow=False), f"{name} differs"
