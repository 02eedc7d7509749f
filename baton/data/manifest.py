"""manifest.json: what a data folder holds, and the proof that its bytes are what was written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import DataError

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
    return parse_manifest(path.read_bytes(), str(path))


def parse_manifest(raw: bytes | str, where: str, fix: str = "rerun `baton prepare`") -> dict[str, Any]:
    """A manifest's JSON, with the fields every reader relies on present and of this format; ``fix`` says
    how to get a good one (a published copy is republished, not prepared again)."""
    try:
        m = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where} is not valid JSON ({e}); {fix}") from None
    if not isinstance(m, dict):
        raise DataError(f"{where} is not a JSON object; {fix}")
    required = ("format", "shards", "total_tokens", "n_shards", "fingerprint", "tokenizer", "dtype")
    missing = [k for k in required if k not in m]
    if missing:
        raise DataError(f"{where} lacks {', '.join(missing)}; it was not written by this baton ({fix})")
    if m["format"] != FORMAT:
        raise DataError(f"{where} has format {m['format']!r}; this baton reads {FORMAT!r}")
    wrong = _wrong_types(m)
    if wrong:
        raise DataError(f"{where} is malformed ({'; '.join(wrong[:3])}): it was edited or damaged after it was "
                        f"written ({fix})")
    return m


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _wrong_types(m: dict[str, Any]) -> list[str]:
    """The fields every reader indexes, of the wrong type or shape: caught here once, so that a hand-edited
    manifest is one line naming it rather than an exception deep inside whichever command read it first."""
    out = [f"{k} must be a count, got {m[k]!r}" for k in ("total_tokens", "n_shards") if not _count(m[k])]
    if m["dtype"] not in ("uint16", "uint32"):
        out.append(f"dtype must be uint16 or uint32, got {m['dtype']!r}")
    if not isinstance(m["fingerprint"], str):
        out.append(f"fingerprint must be a string, got {m['fingerprint']!r}")
    tok = m["tokenizer"]
    if not isinstance(tok, dict) or not isinstance(tok.get("sha256"), str) \
            or not isinstance(tok.get("file", "tokenizer.json"), str):
        out.append("tokenizer must be a record with a file name and a sha256")
    shards = m["shards"]
    if not isinstance(shards, list):
        return [*out, f"shards must be a list of shard records, got {type(shards).__name__}"]
    for i, s in enumerate(shards):
        if not (isinstance(s, dict) and isinstance(s.get("file"), str) and isinstance(s.get("sha256"), str)
                and _count(s.get("tokens"))):
            out.append(f"shard record {i} must have a file name, a sha256 and a token count, got {s!r:.80}")
            break
    if not out:
        names = {s["file"] for s in shards}
        tok_name = tok.get("file", "tokenizer.json")
        if bad_shard_names([{"file": tok_name}]) or tok_name in names or tok_name == MANIFEST:
            out.append(f"the tokenizer's file {tok_name!r} must be a plain file name of its own in the folder")
    return out


def bad_shard_names(shards: list[dict[str, Any]]) -> list[str]:
    """Shard names that are not unique plain file names (a manifest must not point outside its folder)."""
    return sorted({n for n in (s.get("file", "") for s in shards) if not n or "/" in n or "\\" in n
                   or n.startswith(".")})


def manifest_problems(m: dict[str, Any]) -> list[str]:
    """Where a manifest disagrees with itself: shard records against ``n_shards``, per-shard tokens against
    ``total_tokens``, shard names, and the fingerprint against the shard list it summarises. A manifest
    edited by hand (or damaged) after it was written fails here without reading a single shard."""
    problems: list[str] = []
    shards = m["shards"]
    if len(shards) != m["n_shards"]:
        problems.append(f"{MANIFEST}: {len(shards)} shard records but n_shards={m['n_shards']}")
    declared = sum(int(s.get("tokens", 0)) for s in shards)
    if declared != m["total_tokens"]:
        problems.append(f"{MANIFEST}: shard tokens add up to {declared:,} but total_tokens={m['total_tokens']:,}")
    bad, names = bad_shard_names(shards), [s.get("file", "") for s in shards]
    if bad or len(set(names)) != len(names):
        problems.append(f"{MANIFEST}: shard names must be unique plain file names (got {bad or 'duplicates'})")
    try:
        fp = corpus_fingerprint(shards, m["tokenizer"]["sha256"], m["dtype"])
        if fp != m["fingerprint"]:
            problems.append(f"{MANIFEST}: fingerprint {m['fingerprint']} does not match its shard list ({fp})")
    except (KeyError, TypeError, ValueError) as e:
        problems.append(f"{MANIFEST}: malformed shard or tokenizer record ({e})")
    return problems

