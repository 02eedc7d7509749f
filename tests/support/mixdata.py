"""Builders of a small real mix (JSONL + Parquet + a text folder) and configs that prepare it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from baton.data.sources import stdlib_files
from support.helpers import TEST_TOML

STDLIB_BLOCK = '[[data.sources]]\nkind = "stdlib"\nmax_bytes = 400000\n'


def stdlib_documents(start: int, count: int, max_chars: int = 6000) -> list[str]:
    """Real text: top-level functions and classes of the standard library, one per document."""
    docs: list[str] = []
    for f in stdlib_files()[start:]:
        text = f.read_text(encoding="utf-8", errors="replace")
        for part in re.split(r"\n(?=def |class )", text):
            part = part.strip()
            if 200 <= len(part) <= max_chars:
                docs.append(part)
                if len(docs) == count:
                    return docs
    return docs


def write_mix(root: Path, n_jsonl: int = 60, n_parquet: int = 60, n_text: int = 20) -> dict[str, Path]:
    """docs.jsonl (field "text"), docs.parquet (column "body") and texts/ (one document per file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    docs = stdlib_documents(0, n_jsonl + n_parquet + n_text)
    assert len(docs) == n_jsonl + n_parquet + n_text, "the standard library should hold enough documents"
    jsonl = root / "docs.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs[:n_jsonl]):
            f.write(json.dumps({"id": i, "text": d}) + "\n")
    parquet = root / "docs.parquet"
    pq.write_table(pa.table({"body": docs[n_jsonl : n_jsonl + n_parquet]}), parquet, row_group_size=16)
    texts = root / "texts"
    texts.mkdir(exist_ok=True)
    for i, d in enumerate(docs[n_jsonl + n_parquet :]):
        (texts / f"doc-{i:03d}.txt").write_text(d, encoding="utf-8")
    return {"jsonl": jsonl, "parquet": parquet, "texts": texts}


def mix_sources_toml(paths: dict[str, Path], caps: dict[str, int] | None = None,
                     weights: dict[str, float] | None = None) -> str:
    caps, weights = caps or {}, weights or {}
    out = []
    for kind, key, fieldname in (("jsonl", "jsonl", "text"), ("parquet", "parquet", "body"), ("text", "texts", "text")):
        out.append(f'[[data.sources]]\nkind = "{kind}"\npath = "{paths[key]}"\nfield = "{fieldname}"\n'
                   f'max_tokens = {caps.get(key, 0)}\nweight = {weights.get(key, 1.0)}\n')
    return "\n".join(out)


def write_mix_config(path: Path, data_dir: Path, paths: dict[str, Path], store: Path | None = None,
                     runs: Path | None = None, data: dict[str, Any] | None = None, **mix) -> Path:
    """The test config (tests/support/helpers.py) with the stdlib source replaced by the mix; ``data`` sets [data] keys."""
    assert STDLIB_BLOCK in TEST_TOML, "tests/support/helpers.py TEST_TOML changed its data source block"
    base = path.parent
    text = TEST_TOML.format(run_name="mix", runs=runs or base / "runs", data_dir=data_dir,
                            store=store or base / "store")
    text = text.replace(STDLIB_BLOCK, mix_sources_toml(paths, **mix))
    for key, value in (data or {}).items():
        line = f"{key} = {json.dumps(value)}"  # JSON strings, numbers and lists of strings are valid TOML
        text, n = re.subn(rf"(?m)^{key} = .*$", line.replace("\\", "\\\\"), text, count=1)
        if not n:
            text = text.replace("[data]\n", f"[data]\n{line}\n", 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
