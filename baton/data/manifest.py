"""manifest.json: what a data folder holds, and the proof that its bytes are what was written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..guard import shown

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
    m = parse_manifest(path.read_bytes(), str(path))
    # A record that disagrees with itself (shards swapped, duplicated or dropped by hand under the old
    # fingerprint) would train on other data than the fingerprint, and hence every resume check, names.
    problems = manifest_problems(m)
    if problems:
        raise DataError(f"{path} does not agree with itself ({problems[0]}); it was edited or damaged after it was "
                        "written: rerun `baton prepare` (or restore the folder)")
    return m


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
    wrong = _wrong_kinds(m)
    if wrong:
        raise DataError(f"{where} is malformed: {'; '.join(wrong[:3])}; it was edited or damaged after it was "
                        f"written ({fix})")
    return m


def _count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _wrong_kinds(m: dict[str, Any]) -> list[str]:
    """The fields every reader indexes, of a kind this baton does not write: caught here once, so that a
    hand-edited manifest is one line naming it rather than an exception deep inside whichever command read it
    first."""
    tok, shards = m["tokenizer"], m["shards"]
    checks = [
        ("shards is not a list of shard records", isinstance(shards, list) and all(
            isinstance(x, dict) and isinstance(x.get("file"), str) and isinstance(x.get("sha256"), str)
            and _count(x.get("tokens")) for x in shards)),
        ("total_tokens is not a count", _count(m["total_tokens"])),
        ("n_shards is not a count", _count(m["n_shards"])),
        ("fingerprint is not text", isinstance(m["fingerprint"], str)),
        (f"dtype {shown(m['dtype'])} is not uint16 or uint32", m["dtype"] in ("uint16", "uint32")),
        ("tokenizer is not a record with its file, sha256, vocab_size, eos_token and eos_id", isinstance(tok, dict)
         and isinstance(tok.get("file"), str) and isinstance(tok.get("sha256"), str)
         and _count(tok.get("vocab_size")) and isinstance(tok.get("eos_token"), str) and _count(tok.get("eos_id"))),
        # Optional records that commands print or read back (prepare's Hub pins, data-info's summary).
        ("sources is not a list of source records", isinstance(m.get("sources", []), list)
         and all(isinstance(x, dict) for x in m.get("sources", []))),
        ("decontamination is not null or its record (ngram, texts, dropped_documents, dropped_tokens)",
         m.get("decontamination") is None or (isinstance(dc := m["decontamination"], dict) and _count(dc.get("ngram"))
                                              and isinstance(dc.get("texts"), list) and _count(dc.get("dropped_documents"))
                                              and _count(dc.get("dropped_tokens")))),
    ]
    wrong = [what for what, ok in checks if not ok]
    if not wrong:
        # The tokenizer is read from the data folder by this name: it may not point outside it or at a shard.
        name = tok["file"]
        if bad_shard_names([{"file": name}]) or name in {x["file"] for x in shards} or name == MANIFEST:
            wrong.append(f"the tokenizer's file {name!r} is not a plain file name of its own in the folder")
    return wrong


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

