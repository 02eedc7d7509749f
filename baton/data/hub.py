"""Hub sources: a dataset repository's files at one commit, each checked against the Hub's listing before use.

A ``kind = "hub"`` source names a repository, a revision and a glob. Prepare resolves the revision to its
commit once, lists the files at that commit (size, git oid, and for LFS files the sha256 the Hub's storage
addresses them by), and from then on asks for nothing but that commit: a branch that moves during a prepare
cannot mix two revisions into one dataset. Every downloaded file is hashed and compared with the listing
before a single row is read; a mismatch deletes the copy and stops prepare with one line.

Files are fetched through ``huggingface_hub`` (``hf_hub_download`` at the commit), a few ahead of the one
being read. Without ``stream`` they stay in the Hub cache (HF_HOME), so a second prepare reuses them; with it
they go to a folder under the data folder and each is deleted as soon as it is read through, so a corpus
larger than the disk needs room for the shards plus ``1 + prefetch`` source files.

The token is ``huggingface_hub``'s own (HF_TOKEN, or ``hf auth login``); the endpoint HF_ENDPOINT, read when
a source is opened. Neither the token nor a URL carrying it is ever part of a message.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import re
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import extras
from ..errors import DataError
from ..store import hubhttp

SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
STREAM_DIR = ".hub-files"  # under the data folder: the source files of streaming sources, while they are read
GLOB_CHARS = re.compile(r"[*?\[]")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    git_oid: str
    sha256: str | None  # LFS files: the listing's sha256; plain git files are checked by their git oid

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "git_oid": self.git_oid}


def endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _api():
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())


def hub_error(e: BaseException, what: str, repo: str, revision: str, path: str | None = None) -> DataError | None:
    """The one line for a failed Hub call, or None when ``e`` is not one (a bug: let it show)."""
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RevisionNotFoundError

    seen: BaseException | None = e
    while seen is not None:
        status = getattr(getattr(seen, "response", None), "status_code", None)
        if isinstance(seen, HfHubHTTPError) and status == 401:
            return DataError(f"{what}: the Hub refused access to {repo} (HTTP 401): for a private or gated "
                             "repository set HF_TOKEN to a token that may read it (a wrong or expired token gets "
                             "this too)")
        if isinstance(seen, HfHubHTTPError) and status == 403:
            return DataError(f"{what}: the token may not read {repo} (HTTP 403): accept the repository's terms on "
                             "the Hub if it is gated, and set HF_TOKEN to a token with read access")
        if isinstance(seen, RevisionNotFoundError):
            return DataError(f"{what}: revision {revision!r} does not exist in {repo} (name one of its branches, "
                             "tags or commits)")
        if isinstance(seen, EntryNotFoundError):
            return DataError(f"{what}: {repo} has no file {path!r} at {revision} (check the name)")
        if isinstance(seen, HfHubHTTPError) and status == 404:
            return DataError(f"{what}: Hub repository {repo} was not found (HTTP 404): check the name (owner/name) "
                             "and whether it is a dataset or a model repository")
        if isinstance(seen, HfHubHTTPError):
            return DataError(f"{what}: the Hub answered HTTP {status} for {repo}; rerun `baton prepare` later "
                             "(it continues where it stopped)")
        if isinstance(seen, hubhttp.transport_errors()):
            where = endpoint() or "https://huggingface.co"
            return DataError(f"{what}: could not reach the Hub at {where} ({type(seen).__name__}); check the "
                             "network or HF_ENDPOINT, then rerun `baton prepare` (it continues where it stopped)")
        seen = seen.__cause__ or seen.__context__
    return None


def _calling(fn, what: str, repo: str, revision: str, path: str | None = None):
    try:
        return fn()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - classified below; anything else is re-raised as it was
        err = hub_error(e, what, repo, revision, path)
        if err is None:
            raise
        raise err from None


def resolve(repo: str, repo_type: str, revision: str, what: str) -> str:
    """The commit ``revision`` names now."""
    api = _api()
    get = api.dataset_info if repo_type == "dataset" else api.model_info
    info = _calling(lambda: get(repo, revision=revision), what, repo, revision)
    if not info.sha:
        raise DataError(f"{what}: the Hub named no commit for {repo}@{revision}")
    return str(info.sha)


def listing(repo: str, repo_type: str, commit: str, prefix: str, what: str) -> list[HubFile]:
    """Every file under ``prefix`` (a folder, "" for all) at ``commit``."""
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    def call() -> list[HubFile]:
        try:
            tree = list(_api().list_repo_tree(repo, path_in_repo=prefix or None, recursive=True, revision=commit,
                                              repo_type=repo_type))
        except EntryNotFoundError:
            return []  # no such folder: an empty selection, said by the caller with what the repository holds
        return [HubFile(e.path, int(e.size), e.blob_id, e.lfs.sha256 if e.lfs else None)
                for e in tree if isinstance(e, RepoFile)]

    return _calling(call, what, repo, commit)


def glob_prefix(pattern: str) -> str:
    """The folder a glob lies under (listing only it keeps a repository of thousands of files cheap)."""
    parts = pattern.split("/")
    fixed = []
    for part in parts[:-1]:
        if GLOB_CHARS.search(part):
            break
        fixed.append(part)
    return "/".join(fixed)


def select(files: list[HubFile], pattern: str) -> list[HubFile]:
    """Files matching ``pattern`` (fnmatch, as huggingface_hub's allow_patterns: ``*`` crosses folders) that
    are Parquet or JSONL, by path."""
    return sorted((f for f in files if fnmatch.fnmatchcase(f.path, pattern) and f.path.endswith(SUFFIXES)),
                  key=lambda f: f.path)


class HubDataset:
    """The selected files of one repository at one commit: fetched (a few ahead), verified, released."""

    def __init__(self, repo: str, revision: str, pattern: str, what: str, stream_dir: Path | None = None,
                 prefetch: int = 2, config: str = "", split: str = "train"):
        from huggingface_hub import constants
        from huggingface_hub.utils import disable_progress_bars

        if constants.HF_HUB_DISABLE_PROGRESS_BARS is None:
            disable_progress_bars()  # prepare's own bar counts the text; the library's would interleave
        self.repo, self.revision, self.pattern, self.what = repo, revision, pattern, what
        self.config, self.split = config, split
        self.commit = resolve(repo, "dataset", revision, what)
        if config:
            from .hub_card import config_globs

            patterns = config_globs(self._card(), config, split, f"{what}: {repo} at {self.commit[:12]}")
            asked = f"config = {config!r}, split = {split!r} (data_files {', '.join(patterns)})"
        else:
            patterns, asked = [pattern], f"files = {pattern!r}"
        found: dict[str, HubFile] = {}
        for prefix in sorted({glob_prefix(p) for p in patterns}):
            for f in listing(repo, "dataset", self.commit, prefix, what):
                found[f.path] = f
        self.files = sorted({f.path: f for p in patterns for f in select(list(found.values()), p)}.values(),
                            key=lambda f: f.path)
        if not self.files:
            everything = listing(repo, "dataset", self.commit, "", what)
            some = ", ".join(f.path for f in everything[:5]) or "no files"
            raise DataError(f"{what}: no Parquet or JSONL file of {repo} at {self.commit[:12]} matches "
                            f"{asked} (the repository holds {some}{', ...' if len(everything) > 5 else ''}); fix "
                            f"{'the README.md configs or choose another config' if config else 'the glob'}")
        self.stream_dir = stream_dir
        if stream_dir is not None:
            # A killed prepare leaves its downloads in flight as partial files, each named for its process: none
            # is ever resumed, so every kill would add one to the disk. Gone before anything is fetched.
            for partial in stream_dir.rglob("*.incomplete"):
                partial.unlink(missing_ok=True)
        self.prefetch = prefetch
        self._pool = ThreadPoolExecutor(max(1, prefetch), thread_name_prefix="hub-fetch")
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._verified: dict[int, Path] = {}

    def pin(self) -> dict[str, Any]:
        """What the manifest records: the repository, the revision asked for, its commit, the config and split
        that chose the files (where one did), every file's identity."""
        chosen = {"config": self.config, "split": self.split} if self.config else {}
        return {"repo": self.repo, "revision": self.revision, "commit": self.commit, **chosen,
                "files": [f.record() for f in self.files]}

    def _card(self) -> str | None:
        """The repository's README.md at the commit (None: it has none), where its configs are declared."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        from .hub_card import README

        def call() -> str | None:
            try:
                path = hf_hub_download(self.repo, README, repo_type="dataset", revision=self.commit,
                                       endpoint=endpoint())
            except EntryNotFoundError:
                return None
            return Path(path).read_text(encoding="utf-8", errors="replace")

        return _calling(call, self.what, self.repo, self.commit, README)

    def name(self, i: int) -> str:
        return f"{self.repo}/{self.files[i].path}@{self.commit[:12]}"

    def local(self, i: int) -> Path:
        """File ``i`` on local disk, verified; the next ``prefetch`` files start downloading behind it."""
        with self._lock:
            for j in range(i, min(i + 1 + self.prefetch, len(self.files))):
                if j not in self._verified and j not in self._pending:
                    self._pending[j] = self._pool.submit(self._fetch, j)
            fut = self._pending.get(i)
        if fut is not None:
            path = fut.result()
            with self._lock:
                self._pending.pop(i, None)
                self._verified[i] = path
        return self._verified[i]

    def forget_before(self, i: int) -> None:
        """Reading starts at file ``i``: a streaming source deletes the copies of earlier files that a killed
        prepare left (read through, but not yet released when the kill came)."""
        if self.stream_dir is None:
            return
        with self._lock:
            for j in range(min(i, len(self.files))):
                if j not in self._pending and j not in self._verified:
                    (self.stream_dir / self.files[j].path).unlink(missing_ok=True)

    def release(self, i: int) -> None:
        """File ``i`` is read through: a streaming source deletes its copy (a later pass fetches it again)."""
        if self.stream_dir is None:
            return
        with self._lock:
            path = self._verified.pop(i, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def missing_field(self, field: str) -> str | None:
        """Why the first file has no ``field`` (None: it has it, or a short read cannot tell), read from the Hub
        in ranged requests (a Parquet footer, a JSONL file's first line), so that a wrong field is said before
        anything is written or downloaded. Reading names the same problem in any later file."""
        f, name = self.files[0], self.name(0)
        if f.size < 12:
            return None
        if f.path.endswith(".parquet"):
            tail = self._range(0, f.size - 8, f.size - 1)
            n = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or n + 12 > f.size:
                return None  # not Parquet after all: the read says so with the file's name
            pq = extras.require("pyarrow.parquet", "a Hub source's Parquet files")
            try:
                names = pq.read_schema(io.BytesIO(b"PAR1" + self._range(0, f.size - 8 - n, f.size - 1))).names
            except Exception:  # noqa: BLE001 - a damaged footer is the read's to name, with its hashes checked
                return None
            if field in names:
                return None
            return f"{name} has no column {field!r} (columns: {', '.join(names)}); set field = \"...\" on the source"
        head = self._range(0, 0, min(f.size, 1 << 16) - 1)
        try:
            if f.path.endswith(".gz"):
                head = zlib.decompressobj(wbits=31).decompress(head)
            lines = head.split(b"\n")[:-1]  # whole lines only
            lineno, line = next((k + 1, ln) for k, ln in enumerate(lines) if ln.strip())
            obj = json.loads(line)
        except (StopIteration, ValueError, zlib.error):
            return None  # a first line longer than the read, or not JSON: the read names it
        if isinstance(obj, dict) and field in obj:
            return None
        return f"{name}:{lineno} has no field {field!r} (set field = \"...\" on the source)"

    def _range(self, i: int, start: int, end: int) -> bytes:
        """Bytes ``start..end`` (inclusive) of file ``i`` at the commit, without downloading the file."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        f = self.files[i]
        url = hf_hub_url(self.repo, f.path, repo_type="dataset", revision=self.commit, endpoint=endpoint())

        def call() -> bytes:
            r = get_session().get(url, headers={**build_hf_headers(), "Range": f"bytes={start}-{end}"},
                                  follow_redirects=True)
            hf_raise_for_status(r)
            return r.content if r.status_code == 206 else r.content[start : end + 1]  # 200: Range ignored

        return _calling(call, self.what, self.repo, self.commit, f.path)

    def _fetch(self, i: int) -> Path:
        from huggingface_hub import hf_hub_download

        f = self.files[i]
        where: dict[str, Any] = {"local_dir": self.stream_dir} if self.stream_dir is not None else {}
        path = Path(_calling(lambda: hf_hub_download(self.repo, f.path, repo_type="dataset", revision=self.commit,
                                                     endpoint=endpoint(), **where),
                             self.what, self.repo, self.commit, f.path))
        sha, oid, size = _hashes(path)
        if (f.sha256 is not None and sha != f.sha256) or (f.sha256 is None and oid != f.git_oid) or size != f.size:
            _discard(path)
            listed, got = (f.sha256, sha) if f.sha256 is not None else (f"git oid {f.git_oid}", f"git oid {oid}")
            raise DataError(f"{self.what}: {self.name(i)} does not match the Hub's listing ({size:,} bytes hashing "
                            f"to {got}, listed {f.size:,} bytes and {listed}); the copy was deleted: rerun `baton "
                            "prepare` to fetch it again, and report it to the repository's owner if it persists")
        return path


def _hashes(path: Path) -> tuple[str, str, int]:
    """(sha256, git blob oid, size) in one read."""
    size = path.stat().st_size
    sha, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
            git.update(chunk)
    return sha.hexdigest(), git.hexdigest(), size


def _discard(path: Path) -> None:
    """Delete a bad copy: in the Hub cache both the snapshot's link and the blob it points to."""
    target = path.resolve()
    path.unlink(missing_ok=True)
    if target != path:
        target.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------- tokenizers

TOKENIZER_FILE = "tokenizer.json"


def check_moved(out: Path, pins: dict[int, dict[str, Any]], datasets: list[HubDataset | None]) -> None:
    """A source whose revision named other files when ``out`` was prepared (``pins``: what that prepare
    recorded, by source index) is refused with what changed, rather than prepared or continued from another
    commit in silence."""
    for i, hub in enumerate(datasets):
        old = pins.get(i)
        if hub is None or not old or (old.get("repo"), old.get("revision")) != (hub.repo, hub.revision):
            continue
        if old.get("commit") == hub.commit:
            continue
        before = {f.get("path"): (f.get("sha256"), f.get("git_oid")) for f in old.get("files", [])}
        now = {f.path: (f.sha256, f.git_oid) for f in hub.files}
        changes = [f"{what} {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}" for what, names in (
            ("changed", sorted(p for p in now if p in before and before[p] != now[p])),
            ("added", sorted(p for p in now if p not in before)),
            ("removed", sorted(p for p in before if p not in now))) if names]
        if not changes:
            log.info("data source %d: %s moved from %s to %s without touching the selected files", i,
                     hub.revision, str(old.get("commit"))[:12], hub.commit[:12])
            continue
        raise DataError(f"data source {i} (hub {hub.repo}): revision {hub.revision!r} moved from "
                        f"{str(old.get('commit'))[:12]} to {hub.commit[:12]} since {out} was prepared "
                        f"({'; '.join(changes)}): set revision = \"{old.get('commit')}\" to keep the prepared "
                        "data, or rerun `baton prepare --force` to prepare the new commit")


def hub_tokenizer(spec: str) -> tuple[Path, dict[str, Any]]:
    """``hf://owner/name[@revision]`` -> (its tokenizer.json on local disk, verified; where it came from)."""
    rest = spec.removeprefix("hf://")
    repo, _, revision = rest.partition("@")
    revision = revision or "main"
    what = f"data.tokenizer {spec}"
    from huggingface_hub import hf_hub_download

    commit = resolve(repo, "model", revision, what)
    entry = next((f for f in listing(repo, "model", commit, "", what) if f.path == TOKENIZER_FILE), None)
    if entry is None:
        raise DataError(f"{what}: {repo} has no {TOKENIZER_FILE} at {commit[:12]} (name a repository that holds "
                        "one, or give a local tokenizer.json)")
    path = Path(_calling(lambda: hf_hub_download(repo, TOKENIZER_FILE, revision=commit, endpoint=endpoint()),
                         what, repo, commit, TOKENIZER_FILE))
    sha, oid, size = _hashes(path)
    if (entry.sha256 is not None and sha != entry.sha256) or (entry.sha256 is None and oid != entry.git_oid):
        _discard(path)
        raise DataError(f"{what}: {repo}/{TOKENIZER_FILE}@{commit[:12]} does not match the Hub's listing; the "
                        "copy was deleted: rerun `baton prepare` to fetch it again")
    return path, {"repo": repo, "revision": revision, "commit": commit, "sha256": sha}
