"""manifest.json: what a data folder holds, and the proof that its bytes are what was written."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..hashing import sha256_file
from .shards import read_header

MANIFEST = "manifest.json"
FORMAT = "baton-data-v1"


def corpus_fingerprint(shards: list[dict[str, Any]], tokenizer_sha256: str, dtype: str) -> str:
    """Content identity of the token stream: shard hashes in order, the tokenizer and the dtype.

    Paths, times and machine names are deliberately left out: the same tokens prepared anywhere get the
    same fingerprint, and a single changed document changes it.
    """
    h = hashlib.sha256()
    h.update(f"{FORMAT}|{dtype}|{tokenizer_sha256}|".encode())
    for s in shards:
        h.update(f"{s['sha256']}:{s['tokens']};".encode())
    return h.hexdigest()[:16]


def load_manifest(data_dir: str | Path) -> dict[str, Any]:
    path = Path(data_dir) / MANIFEST
    if not Path(data_dir).is_dir():
        raise DataError(f"data folder {data_dir} does not exist (run `baton prepare --config ...` first)")
    if not path.is_file():
        raise DataError(f"{path} not found: the data folder is not prepared (run `baton prepare --config ...`)")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); rerun `baton prepare`") from None
    missing = [k for k in ("format", "shards", "total_tokens", "n_shards", "fingerprint", "tokenizer", "dtype") if k not in m]
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)}; it was not written by this baton (rerun `baton prepare`)")
    if m["format"] != FORMAT:
        raise DataError(f"{path} has format {m['format']!r}; this baton reads {FORMAT!r}")
    return m


@dataclass
class VerifyReport:
    files_hashed: int
    total_tokens: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"verify-data: {self.files_hashed} files hashed, {self.total_tokens:,} tokens, "
            f"{len(self.problems)} mismatches"
        )


def verify_manifest(data_dir: str | Path, workers: int = 4) -> VerifyReport:
    """Rehash every shard and check the manifest agrees with itself and with the folder."""
    data_dir = Path(data_dir)
    m = load_manifest(data_dir)
    problems: list[str] = []
    shards = m["shards"]
    if len(shards) != m["n_shards"]:
        problems.append(f"manifest lists {len(shards)} shards but declares n_shards={m['n_shards']}")
    declared = sum(s["tokens"] for s in shards)
    if declared != m["total_tokens"]:
        problems.append(f"manifest shard tokens add up to {declared:,} but total_tokens={m['total_tokens']:,}")
    listed = {s["file"] for s in shards}
    on_disk = {p.name for p in data_dir.glob("*.bin")}
    for extra in sorted(on_disk - listed):
        problems.append(f"{extra}: shard file not listed in the manifest")

    def check(s: dict[str, Any]) -> str | None:
        path = data_dir / s["file"]
        if not path.is_file():
            return f"{s['file']}: listed in the manifest but missing"
        try:
            _, count = read_header(path)
        except DataError as e:
            return f"{s['file']}: {e}"
        if count != s["tokens"]:
            return f"{s['file']}: header holds {count:,} tokens, manifest says {s['tokens']:,}"
        digest = sha256_file(path)
        if digest != s["sha256"]:
            return f"{s['file']}: sha256 {digest[:12]}… differs from the manifest's {s['sha256'][:12]}…"
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # hashlib releases the GIL
        results = list(pool.map(check, shards))
    problems += [r for r in results if r]
    fp = corpus_fingerprint(shards, m["tokenizer"]["sha256"], m["dtype"])
    if fp != m["fingerprint"]:
        problems.append(f"{MANIFEST}: fingerprint {m['fingerprint']} does not match its shard list ({fp})")
    return VerifyReport(files_hashed=len(shards), total_tokens=declared, problems=problems)
