"""`baton verify-data`: rehash every file of a data folder and check the manifest against itself.

The folder is a local path or a store URL (file://, s3://, hf://: anything ``open_store`` opens). A store
is read through the store protocol only: the listing for names and sizes, ``get_file`` for the bytes,
which are hashed here, never taken on the store's word. Checks:

- the manifest agrees with itself: shard records = declared ``n_shards`` = shard files found, per-shard
  tokens add up to ``total_tokens``, the fingerprint matches the shard list;
- every listed shard exists, has the size its token count implies, a valid header with that count, and
  the sha256 the manifest records; no shard file exists that the manifest does not list;
- every token id in a shard is below the tokenizer's ``vocab_size`` (one max per shard: shards that hash
  right but were written with another tokenizer would otherwise fail only in training);
- the tokenizer file has the recorded sha256, and the vocabulary size and end-of-text token recorded beside
  it are the file's own (the sha256 covers the file, not what the record says of it).

Every problem names its file, one problem per file.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError, StoreError
from ..hashing import sha256_file
from .manifest import MANIFEST, bad_shard_names, manifest_problems, parse_manifest
from .shards import HEADER_SIZE, open_shard, read_header


@dataclass
class VerifyReport:
    files_hashed: int
    total_tokens: int
    problems: list[str]
    records: int = 0
    declared: int = 0
    found: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"verify-data: {self.files_hashed} files hashed, {self.total_tokens:,} tokens, "
            f"{len(self.problems)} mismatches (shards: {self.records} records, {self.declared} declared, "
            f"{self.found} found)"
        )


class _Folder:
    """A local data folder."""

    def __init__(self, path: Path):
        self.path = path

    def describe(self) -> str:
        return str(self.path)

    def manifest(self) -> bytes | None:
        try:
            return (self.path / MANIFEST).read_bytes()
        except FileNotFoundError:
            return None

    def sizes(self) -> dict[str, int]:
        if not self.path.is_dir():
            raise DataError(f"data folder {self.path} does not exist (run `baton prepare --config ...` first)")
        return {e.name: e.stat().st_size for e in os.scandir(self.path) if e.is_file()}

    def inspect(self, name: str) -> tuple[int, str, int]:
        """(token count from the header, sha256, largest token id); DataError when the header is bad."""
        return _inspect(self.path / name)


class _InStore:
    """A data folder at the root of a store: bytes come down one file at a time and are hashed here."""

    def __init__(self, url: str):
        from ..store import open_store

        self.store = open_store(url, key="data folder")
        self.tmp = Path(tempfile.mkdtemp(prefix="baton-verify-"))

    def describe(self) -> str:
        return self.store.describe()

    def manifest(self) -> bytes | None:
        text = self.store.read_text(MANIFEST)
        return None if text is None else text.encode("utf-8")

    def sizes(self) -> dict[str, int]:
        listing = self.store.list("", checksums=False)
        return {k: info.size for k, info in listing.items() if "/" not in k}

    def inspect(self, name: str) -> tuple[int, str, int]:
        local = self.tmp / name
        try:
            self.store.get_file(name, local)
            return _inspect(local)
        finally:
            local.unlink(missing_ok=True)

    def close(self) -> None:
        try:
            self.tmp.rmdir()
        except OSError:
            pass


def _inspect(path: Path) -> tuple[int, str, int]:
    count = read_header(path)[1]
    tokens = open_shard(path)
    return count, sha256_file(path), int(tokens.max()) if tokens.size else -1


def verify_data(location: str, workers: int = 0) -> VerifyReport:
    """Verify the data folder at a local path or store URL; problems are reported, not raised."""
    where = _InStore(location) if "://" in location else _Folder(Path(location))
    try:
        return _verify(where, workers or min(16, 2 * (os.cpu_count() or 1)))
    finally:
        if isinstance(where, _InStore):
            where.close()


def _verify(where, workers: int) -> VerifyReport:
    raw = where.manifest()
    if raw is None:
        raise DataError(f"{MANIFEST} not found in {where.describe()}: not a prepared data folder "
                        "(run `baton prepare`, or point at the folder that holds manifest.json)")
    m = parse_manifest(raw, f"{MANIFEST} in {where.describe()}")
    sizes = where.sizes()
    problems: list[str] = []
    shards: list[dict[str, Any]] = m["shards"]
    itemsize = {"uint16": 2, "uint32": 4}[m["dtype"]]  # parse_manifest refused any other
    found = sorted(n for n in sizes if n.endswith(".bin"))
    declared_tokens = sum(int(s.get("tokens", 0)) for s in shards)
    # records = declared = found: a record/declared mismatch is the manifest's; a file found but not
    # recorded, or recorded but not found, is named below by its own name.
    problems += manifest_problems(m)
    names = [s.get("file", "") for s in shards]
    bad_names = bad_shard_names(shards)
    shards = [s for s in shards if s.get("file") not in bad_names]
    for extra in sorted(set(found) - set(names)):
        problems.append(f"{extra}: shard file not listed in the manifest")

    vocab = int(m["tokenizer"]["vocab_size"])

    def check(s: dict[str, Any]) -> tuple[bool, str | None]:
        """(hashed, problem) for one shard."""
        name, tokens = s["file"], int(s["tokens"])
        if name not in sizes:
            return False, f"{name}: listed in the manifest but missing"
        expected = HEADER_SIZE + tokens * itemsize
        if sizes[name] != expected:
            return False, (f"{name}: {sizes[name]:,} bytes, but {tokens:,} tokens make {expected:,}: "
                           "truncated or padded (rerun `baton prepare`)")
        try:
            count, digest, top = where.inspect(name)
        except (DataError, StoreError) as e:
            return False, f"{name}: {e}"
        if count != tokens:
            return True, f"{name}: header holds {count:,} tokens, manifest says {tokens:,}"
        if digest != s["sha256"]:
            return True, f"{name}: sha256 {digest[:12]}… differs from the manifest's {s['sha256'][:12]}…"
        if top >= vocab:
            return True, (f"{name}: holds token id {top}, outside the tokenizer's {vocab} tokens: the shards were not "
                          "written with this tokenizer (rerun `baton prepare`)")
        return True, None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # hashlib and file I/O release the GIL
        results = list(pool.map(check, shards))
    hashed = sum(h for h, _ in results)
    problems += [p for _, p in results if p]
    hashed += _check_tokenizer(where, m, sizes, problems)
    return VerifyReport(hashed, declared_tokens, problems, len(m["shards"]), m["n_shards"], len(found))


def _check_tokenizer(where, m: dict[str, Any], sizes: dict[str, int], problems: list[str]) -> int:
    tok = m["tokenizer"]
    name = tok.get("file", "tokenizer.json")
    if name not in sizes:
        problems.append(f"{name}: the tokenizer is missing")
        return 0
    if isinstance(where, _Folder):
        digest, said = sha256_file(where.path / name), _recorded_problem(where.path / name, tok)
    else:
        local = where.tmp / name
        try:
            where.store.get_file(name, local)
            digest, said = sha256_file(local), _recorded_problem(local, tok)
        finally:
            local.unlink(missing_ok=True)
    if digest != tok.get("sha256"):
        problems.append(f"{name}: sha256 {digest[:12]}… differs from the manifest's {str(tok.get('sha256'))[:12]}…")
    elif said:
        problems.append(f"{name}: {said}")
    return 1


def _recorded_problem(path: Path, tok: dict[str, Any]) -> str | None:
    """Where the manifest's vocab_size, eos_token or eos_id differ from the tokenizer file's own."""
    from .tokenize import find_eos, load_tokenizer

    try:
        t = load_tokenizer(path)
        own = {"vocab_size": t.get_vocab_size(with_added_tokens=True), **dict(zip(("eos_token", "eos_id"),
                                                                                  find_eos(t)))}
    except DataError as e:
        return str(e)
    wrong = [f"{k} {tok.get(k)!r} (the file's: {v!r})" for k, v in own.items() if tok.get(k) != v]
    return f"the manifest records {', '.join(wrong)}: it was edited after prepare (rerun `baton prepare`)" if wrong \
        else None
