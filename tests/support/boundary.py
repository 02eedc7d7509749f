"""Shared by the boundary tests: run `baton` in this process, read what reached the terminal, hash a store."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from baton.cli import main


@dataclass
class Outcome:
    status: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if "error:" in line]


def run_in_process(argv: list[str], capsys) -> Outcome:
    """The real `baton.cli.main`, here: what a person's terminal would show, and the exit status."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as e:  # --help/--version only
        status = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return Outcome(status, out, err)


def assert_input_error(o: Outcome, *expect: str) -> str:
    """Exit 2, one `baton: error:` line (the last thing said), no traceback, no usage block."""
    assert o.status == 2, f"exit {o.status}\n{o.stderr[-3000:]}"
    assert "Traceback" not in o.stderr + o.stdout, o.stderr[-3000:]
    assert "usage:" not in o.stderr, o.stderr[-3000:]
    assert len(o.error_lines) == 1, o.stderr[-3000:]
    line = o.error_lines[0]
    assert line.startswith("baton: error: "), line
    assert o.stderr.rstrip("\n").splitlines()[-1] == line, o.stderr[-3000:]
    for part in expect:
        assert part in line, f"{part!r} not in: {line}"
    return line


def tree_hash(root: Path) -> str:
    """Every file's relative path and bytes under ``root`` (nothing there hashes as such)."""
    h = hashlib.sha256()
    if not root.exists():
        return "absent"
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes() if p.is_file() else b"<not a file>")
            h.update(b"\0")
    return h.hexdigest()
