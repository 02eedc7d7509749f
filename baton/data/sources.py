"""Input sources: text files, JSONL, Parquet, `datasets` folders, each read from a resumable position.

Every reader yields ``(text, nbytes, next_pos)``: the document, the bytes it took in the source (what size
estimates and ``max_bytes`` are measured in), and a small JSON-able position from which reading resumes
right after it. Positions are seekable (a byte offset in a JSONL file, a row in a Parquet file or a
dataset), so continuing an interrupted prepare never re-reads what came before.
"""

from __future__ import annotations

import glob
import gzip
import json
import logging
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import extras
from ..config import SourceConfig
from ..errors import DataError
from ..guard import shown
from ..reads import reading
from .hub import STREAM_DIR, HubDataset

log = logging.getLogger(__name__)

Doc = tuple[str, int, list[int]]
GZIP_RATIO = 4  # size estimate of gzip-compressed text: the interleave only needs proportions
SUFFIXES = {"jsonl": (".jsonl", ".json", ".jsonl.gz", ".json.gz"), "parquet": (".parquet",)}
BOM = b"\xef\xbb\xbf"
# Compressions read as bytes they are not: named by their first bytes (gzip, by its suffix, is read).
COMPRESSED = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip",
              b"\x1f\x8b": "gzip (without a .gz suffix)"}
UNREAD_SUFFIXES = (".bz2", ".xz", ".zst", ".zstd", ".zip", ".lz4", ".7z")
SURROGATE = re.compile("[\ud800-\udfff]")


def stdlib_files() -> list[Path]:
    """The running Python's own top-level library modules: a corpus present on every machine."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def expand(path: str, kind: str = "text", exclude: tuple[Path, ...] = ()) -> list[Path]:
    """A file, a folder (recursively; hidden files and, for JSONL/Parquet, other suffixes skipped) or a glob.

    Each file once, however many names reach it (symlinked folders, a loop through ``..``): the first name in
    sorted order. Nothing under ``exclude`` (resolved folders: baton's own data, run and store folders, whose
    files are never documents)."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        found = [q for q in p.rglob("*")
                 if q.is_file() and not any(part.startswith(".") for part in q.relative_to(p).parts)]
        if kind in SUFFIXES:
            found = [q for q in found if q.name.endswith(SUFFIXES[kind])]
    else:
        found = [Path(q) for q in glob.glob(str(p), recursive=True) if Path(q).is_file()]
    files, seen = [], set()
    for q in sorted(found):
        real = Path(os.path.realpath(q))
        if real in seen or any(real == d or d in real.parents for d in exclude):
            continue
        seen.add(real)
        files.append(q)
    return files


def compression(head: bytes) -> str | None:
    """The compression a file's first bytes show, of those baton does not read; None for none of them."""
    return next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)


def decode_text(raw: bytes, path: str | Path) -> str:
    """A text file's bytes as UTF-8, a leading byte-order mark dropped. Any other encoding is refused: decoding
    it with replacement characters would train on garbage without a word."""
    raw = raw.removeprefix(BOM)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        packed = compression(raw[:8])
        if packed:
            raise DataError(f"data source file {shown(path)} is {packed}-compressed, which baton does not read: "
                            "decompress it (gzip files named *.gz are read as they are)") from None
        utf16 = " (it starts like UTF-16)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise DataError(f"data source file {shown(path)} is not UTF-8 text: byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start:,}{utf16}; convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or remove it "
                        "from the source") from None


def document(value: Any, where: str, field: str) -> str | None:
    """A record's text field as a document: None (skipped) for null or empty; UTF-8 bytes decoded; any other
    kind of value refused, not stored as Python's printed form of it."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{where}: field {field!r} holds bytes that are not UTF-8 text; point field at a text "
                            "column, or convert the values to UTF-8 strings") from None
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} holds a {type(value).__name__}, not text; point field at a text "
                        "column (set field = \"...\" on the source), or convert the values to strings")
    return value or None


def unread_files(path: str) -> str:
    """Why a folder matched no files, where it holds files of a compression baton does not read."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return ""
    packed = sorted({q.name.rsplit(".", 1)[-1] for q in p.rglob("*") if q.name.endswith(UNREAD_SUFFIXES)})
    if not packed:
        return ""
    return (f"it holds .{', .'.join(packed)} files, a compression baton does not read: decompress them, or "
            "recompress them with gzip (*.gz)")


def _open_text(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _reading(path: Path, kind: str):
    """A source file read through its library (gzip, json, pyarrow, datasets): a damaged one is named."""
    what = {"parquet": "Parquet file", "hf_dataset": "dataset folder"}.get(
        kind, "gzip file" if path.name.endswith(".gz") else f"{kind} file")
    return reading(path, f"data source {what}", "replace or remove the file, or fix the source's path, then rerun "
                   "`baton prepare`")


class SourceReader:
    """One configured source: its files, their identity and size, and documents from a position."""

    def __init__(self, src: SourceConfig, index: int, data_dir: str | Path | None = None,
                 exclude: tuple[Path, ...] = ()):
        self.src, self.index = src, index
        self.kind = src.kind
        self.hub: HubDataset | None = None
        if src.kind == "hub":
            # Streaming copies live under the data folder (per source), so they leave with it.
            where = Path(data_dir) / STREAM_DIR / str(index) if src.stream and data_dir is not None else None
            self.hub = HubDataset(src.repo, src.revision, src.files, f"data source {index} (hub {src.repo}@"
                                  f"{src.revision})", where, src.prefetch, src.config, src.split)
            self.files = [Path(f.path) for f in self.hub.files]
        elif src.kind == "stdlib":
            self.files = stdlib_files()
        else:
            self.files = expand(src.path, src.kind, exclude)
        if not self.files:
            raise DataError(f"data source {index} ({src.kind} {shown(src.path)}) matches no files "
                            f"({unread_files(src.path) or 'check the path or glob'})")
        if src.kind == "hf_dataset":
            self._dataset = self._load_dataset()
        self.est_bytes = self._estimate()

    def check_field(self) -> None:
        """A Hub source whose first file lacks the configured field is refused before prepare writes or downloads
        anything (its files would otherwise be fetched, and the folder begun, only to stop at the first row)."""
        if self.hub is not None and (why := self.hub.missing_field(self.src.field)):
            raise DataError(why)

    def identity(self) -> list[list[Any]]:
        """What the prepared bytes depend on, cheaply: every file's path, size and modification time."""
        if self.hub is not None:
            # The content, not the commit: a branch that moved without touching these files changes nothing.
            return [[self.hub.repo, f.path, f.sha256 or f.git_oid, f.size] for f in self.hub.files]
        out = []
        for f in self.files:
            st = f.stat()
            out.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
        return out

    def _estimate(self) -> int:
        if self.hub is not None:  # from the listing: the files are not here yet
            return sum(f.size * (GZIP_RATIO if f.path.endswith(".gz") else 1) for f in self.hub.files)
        if self.kind == "parquet":
            pq = extras.require("pyarrow.parquet", "a parquet source")

            total = 0
            for f in self.files:
                with _reading(f, "parquet"):
                    md = pq.ParquetFile(f).metadata
                for g in range(md.num_row_groups):
                    rg = md.row_group(g)
                    total += sum(rg.column(c).total_uncompressed_size for c in range(rg.num_columns)
                                 if rg.column(c).path_in_schema == self.src.field)
            return total or sum(f.stat().st_size for f in self.files)  # a nested column: the files will do
        if self.kind == "hf_dataset":
            return sum(f.stat().st_size for f in self.files if f.suffix == ".arrow")
        return sum(f.stat().st_size * (GZIP_RATIO if f.name.endswith(".gz") else 1) for f in self.files)

    def start(self) -> list[int]:
        return {"jsonl": [0, 0, 1], "parquet": [0, 0], "hub": [0, 0, 1]}.get(self.kind, [0])

    def read(self, pos: list[int]) -> Iterator[Doc]:
        """Documents from ``pos`` on; each comes with the position just after it."""
        if self.kind in ("text", "stdlib"):
            return self._text(pos)
        if self.kind == "jsonl":
            return self._jsonl(pos)
        if self.kind == "parquet":
            return self._parquet(pos)
        if self.kind == "hub":
            return self._hub(pos)
        return self._hf(pos)

    # ---- kinds
    def _text(self, pos: list[int]) -> Iterator[Doc]:
        for i in range(pos[0], len(self.files)):
            with _reading(self.files[i], "text"), _open_text(self.files[i]) as fh:
                raw = fh.read()
            text = decode_text(raw, self.files[i])
            if text:
                yield text, len(raw), [i + 1]

    def _jsonl(self, pos: list[int]) -> Iterator[Doc]:
        """pos = [file, byte offset, line number]."""
        fi, offset, lineno = pos
        while fi < len(self.files):
            yield from self._jsonl_file(self.files[fi], str(self.files[fi]), fi, offset, lineno)
            fi, offset, lineno = fi + 1, 0, 1

    def _jsonl_file(self, path: Path, name: str, fi: int, offset: int, lineno: int) -> Iterator[Doc]:
        field = self.src.field
        mended = 0
        with _reading(path, "jsonl"), _open_text(path) as fh:
            if offset == 0 and not path.name.endswith(".gz") and (packed := compression(fh.read(8))):
                raise DataError(f"{name} is {packed}-compressed, which baton does not read: decompress it, or "
                                "compress it with gzip and name it *.jsonl.gz")
            fh.seek(offset)
            for line in fh:
                offset += len(line)
                lineno += 1
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise DataError(f"{name}:{lineno - 1} is not valid JSON ({e}); fix or remove the line") \
                        from None
                if not isinstance(obj, dict) or field not in obj:
                    raise DataError(f"{name}:{lineno - 1} has no field {field!r} "
                                    "(set field = \"...\" on the source)")
                text = document(obj[field], f"{name}:{lineno - 1}", field)
                if text is None:
                    continue
                if not text.isascii() and SURROGATE.search(text):
                    # Half of a surrogate pair (an emoji cut in two upstream): JSON allows it, UTF-8 has no
                    # encoding for it. The character was lost before baton saw it; the document is kept.
                    text = SURROGATE.sub("\ufffd", text)
                    if not mended:
                        log.warning("%s:%d: a lone UTF-16 surrogate (half of a character) replaced by U+FFFD; "
                                    "later ones in this file are replaced too", name, lineno - 1)
                    mended += 1
                yield text, len(line), [fi, offset, lineno]

    def _parquet(self, pos: list[int]) -> Iterator[Doc]:
        """pos = [file, row]; reading starts at the row group holding the row, one batch in memory."""
        pq = extras.require("pyarrow.parquet", "a parquet source")

        fi, row = pos
        while fi < len(self.files):
            with _reading(self.files[fi], "parquet"):
                yield from self._parquet_file(pq.ParquetFile(self.files[fi]), str(self.files[fi]), fi, row)
            fi, row = fi + 1, 0

    def _parquet_file(self, pf, name: str, fi: int, row: int, fix: str = "") -> Iterator[Doc]:
        field = self.src.field
        if field not in pf.schema_arrow.names:
            names = ", ".join(pf.schema_arrow.names)
            raise DataError(f"{name} has no column {field!r} (columns: {names}){fix}")
        md, first, g = pf.metadata, 0, 0
        while g < md.num_row_groups and first + md.row_group(g).num_rows <= row:
            first += md.row_group(g).num_rows
            g += 1
        if g < md.num_row_groups:
            r = first
            for batch in pf.iter_batches(batch_size=1024, row_groups=range(g, md.num_row_groups), columns=[field]):
                values = batch.column(0).to_pylist()
                for k in range(max(0, row - r), len(values)):
                    text = document(values[k], f"{name} row {r + k}", field)
                    if text is None:
                        continue
                    yield text, len(text.encode("utf-8")), [fi, r + k + 1]
                r += len(values)

    def _hub(self, pos: list[int]) -> Iterator[Doc]:
        """pos = [file, row or byte offset, line number (JSONL)]: a file is fetched when reading reaches it.

        A file's last document comes with the position of the next file's start, so a prepare that saved its
        place after that document never fetches the file again to find there is nothing left in it."""
        assert self.hub is not None
        hub, (fi, at, lineno) = self.hub, pos
        hub.forget_before(fi)
        while fi < len(hub.files):
            held: Doc | None = None
            for doc in self._hub_file(fi, at, lineno):
                if held is not None:
                    yield held
                held = doc
            hub.release(fi)
            if held is not None:
                yield held[0], held[1], [fi + 1, 0, 1]
            fi, at, lineno = fi + 1, 0, 1

    def _hub_file(self, fi: int, at: int, lineno: int) -> Iterator[Doc]:
        assert self.hub is not None
        path, name = self.hub.local(fi), self.hub.name(fi)
        if path.name.endswith(".parquet"):
            pq = extras.require("pyarrow.parquet", "a Hub source's Parquet files")
            with _reading(path, "parquet"):
                for text, nbytes, nxt in self._parquet_file(pq.ParquetFile(path), name, fi, at,
                                                            "; set field = \"...\" on the source"):
                    yield text, nbytes, [fi, nxt[1], 1]
        else:
            yield from self._jsonl_file(path, name, fi, at, lineno)

    def close(self) -> None:
        if self.hub is not None:
            self.hub.close()

    def _load_dataset(self):
        datasets = extras.require("datasets", "source kind hf_dataset")
        try:
            with _reading(Path(self.src.path), "hf_dataset"):
                ds = datasets.load_from_disk(self.src.path)
        except FileNotFoundError as e:
            raise DataError(f"{self.src.path} is not a folder saved by datasets' save_to_disk ({e})") from None
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                first = next(iter(ds), None)
                if first is None:
                    raise DataError(f"dataset {shown(self.src.path)} holds no split; save one with save_to_disk")
                log.info("dataset %s has no train split: reading %r, the first saved (splits: %s)", self.src.path,
                         first, ", ".join(ds))
            ds = ds["train"] if "train" in ds else ds[first]
        if self.src.field not in ds.column_names:
            names = ", ".join(ds.column_names)
            raise DataError(f"dataset {self.src.path} has no column {self.src.field!r} (columns: {names})")
        return ds.select_columns([self.src.field])

    def _hf(self, pos: list[int]) -> Iterator[Doc]:
        ds, field = self._dataset, self.src.field
        for a in range(pos[0], len(ds), 1024):
            values = ds[a : a + 1024][field]
            for k, v in enumerate(values):
                text = document(v, f"dataset {self.src.path} row {a + k}", field)
                if text is None:
                    continue
                yield text, len(text.encode("utf-8")), [a + k + 1]
