"""The prepare journal: one JSON line per finished shard, so an interrupted prepare continues, not restarts.

Line 1 is the header (the spec and the tokenizer's sha256). Each later line is written only after its
shard file is complete on disk (written, fsynced, renamed) and records where the next shard starts: the
mix state before the batch holding the document in progress, that document's index in the batch, how many
of its tokens are already written, and the per-source counts so far. A SIGKILL can at worst leave a
partial last line, which is ignored; the shard it described is then written again, to the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

JOURNAL = "prepare.journal"


class Journal:
    def __init__(self, folder: Path):
        self.path = folder / JOURNAL

    def load(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """(header, complete records), or None when there is no readable journal."""
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return None
        parsed = []
        for line in lines:
            if not line.strip():
                continue
            try:
                parsed.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                break  # a line cut short by a kill: everything after it is unproven
        if not parsed or "header" not in parsed[0]:
            return None
        return parsed[0]["header"], parsed[1:]

    def write(self, header: dict[str, Any], records: Sequence[dict[str, Any]] = ()) -> None:
        """Start (or rewrite, after dropping records) the journal atomically."""
        tmp = self.path.with_name(JOURNAL + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"header": header}, sort_keys=True) + "\n")
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
