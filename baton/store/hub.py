"""The Hugging Face Hub as the store, through ``huggingface_hub``: ``hf://owner/repo[?revision=main&type=model]``.

One commit per checkpoint (every file of a folder in one ``create_commit``), one per pointer write, one per
retention deletion. What the Hub lists as an object's sha256: for LFS files (weights, anything binary or
over 10 MB) the ``lfs.oid`` of its tree listing, the sha256 the Hub's storage addressed the upload by; small
text files are plain git blobs whose listing carries only a git oid, so those are downloaded, checked
against that oid and hashed. Read-back is a ranged GET of ``/{repo}/resolve/{revision}/{path}``, following
the Hub's redirect to its CDN, where the answer must be a 206 naming exactly the range asked for.

The token comes from ``huggingface_hub`` itself (HF_TOKEN, or ``hf auth login``); it is never printed.
When ``hf_xet`` is installed the client uploads through Xet; HF_HUB_DISABLE_XET=1 makes it use the
classic LFS path instead. ``huggingface_hub`` retries some calls itself (5xx, 429, network errors, about
20 s at most); baton's bounded retry sits above that.
"""

from __future__ import annotations

import builtins
import copy
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, quote, urlsplit

import huggingface_hub as hf
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import build_hf_headers, disable_progress_bars, get_session, hf_raise_for_status

from ..errors import ConfigError, StoreError, WriteConflict
from ..guard import split_url
from . import hubhttp
from .base import ObjectInfo, RangeRead, Versioned, decode_text, safe_key, write_download
from .retry import RetryPolicy, Transient, call, unresolved_error


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _denied(access: dict, repo_id: str, repo_type: str) -> str:
    """Why the Hub's description of an access token (whoami's ``auth.accessToken``) rules out writing to the
    repository, or "" when it does not or cannot be told from it."""
    role = access.get("role")
    if role == "read":
        return "a read token"
    if role != "fineGrained":
        return ""
    scoped = (access.get("fineGrained") or {}).get("scoped")
    if not isinstance(scoped, builtins.list):
        return ""
    owner = repo_id.split("/")[0]
    # A fine-grained token's permissions name a user or organization (all its repositories) or one repository.
    for grant in scoped:
        if not isinstance(grant, dict) or not isinstance(grant.get("entity"), dict):
            return ""  # a shape not known here: no verdict
        entity = grant["entity"]
        if (entity.get("type"), entity.get("name")) in (("user", owner), ("org", owner), (repo_type, repo_id)) \
                and "repo.write" in (grant.get("permissions") or []):
            return ""
    return f"a fine-grained token without repo.write on {owner} or {repo_id}"


class HubStore:
    def __init__(self, repo_id: str, repo_type: str = "model", revision: str = "main", endpoint: str | None = None,
                 token: str | None = None, retry: RetryPolicy | None = None):
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.revision = revision
        self.retry = retry or RetryPolicy()
        self.timeout = hubhttp.timeout(self.retry.request_timeout)
        self.api = HfApi(endpoint=endpoint, token=token)
        self.endpoint = self.api.endpoint.rstrip("/")
        self._token = token or hf.get_token()
        self._reached = False  # whether the Hub has answered a call of this client yet
        hubhttp.quiet_library_retries()
        # Fencing (``fence``): every commit names its parent, so this client's commits form one unbroken line on
        # the branch; ``_line`` holds the commits from which every later one up to ``_last`` is this client's.
        self._on_moved: Callable[[], str] | None = None
        self._last: str | None = None
        self._line: set[str] = set()
        self._line_lock = threading.Lock()
        if hf.constants.HF_HUB_DISABLE_PROGRESS_BARS is None:
            # Pushes run beside the training's progress bar; the library's own bars would interleave with it.
            disable_progress_bars()

    @classmethod
    def from_url(cls, url: str, retry: RetryPolicy | None = None, endpoint: str | None = None,
                 token: str | None = None, key: str = "store.url") -> HubStore:
        """``key``: the config key the URL came from, named in the errors."""
        parts = split_url(url, key)
        if parts.username or parts.password or "@" in parts.netloc:
            raise ConfigError(f"{key} must not carry a token; set HF_TOKEN or run `hf auth login`")
        repo_id = (parts.netloc + parts.path).strip("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        # hf://datasets/owner/name names a dataset repository, as huggingface_hub's own hf:// paths do.
        typed = repo_id.startswith("datasets/") and repo_id.count("/") == 2
        if typed:
            repo_id = repo_id.removeprefix("datasets/")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ConfigError(f"{key} {url!r} must name a repository as hf://owner/repo or "
                              "hf://datasets/owner/name")
        unknown = sorted(set(query) - {"revision", "type"})
        if unknown:
            raise ConfigError(f"{key} has unknown option(s) {', '.join(unknown)} (known: revision, type)")
        if typed and query.get("type", "dataset") != "dataset":
            raise ConfigError(f"{key} {url!r} names a dataset repository but says type={query['type']}")
        repo_type = query.get("type", "dataset" if typed else "model")
        if repo_type not in ("model", "dataset"):
            raise ConfigError(f"{key} type={repo_type!r}: use model or dataset")
        endpoint = endpoint or os.environ.get("HF_ENDPOINT")
        if endpoint:
            # The endpoint is named in every log line and error about the store: it must hold no secret.
            ep = split_url(endpoint, "the Hub endpoint (HF_ENDPOINT)")
            if ep.username or ep.password or "@" in ep.netloc:
                raise ConfigError("the Hub endpoint (HF_ENDPOINT) must not carry credentials; set HF_TOKEN or run "
                                  "`hf auth login` instead")
            if ep.scheme not in ("http", "https") or not ep.netloc:
                raise ConfigError(f"the Hub endpoint (HF_ENDPOINT) {endpoint!r} is not an http(s) URL")
        return cls(repo_id, repo_type, query.get("revision", "main"), endpoint, token, retry)

    # ---------------------------------------------------------------------------------- helpers
    def describe(self) -> str:
        where = f"hf://{'datasets/' if self.repo_type == 'dataset' else ''}{self.repo_id}"
        return f"Hub store {where}@{self.revision}" + (
            f" (endpoint {self.endpoint})" if self.endpoint != "https://huggingface.co" else "")

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token and len(self._token) >= 8 else text

    def _classify(self, e: Exception) -> Exception:
        unresolved = unresolved_error(e, self._reached, urlsplit(self.endpoint).hostname or self.endpoint)
        if unresolved is not None:
            return unresolved
        seen: BaseException | None = e
        while seen is not None:
            if isinstance(seen, RepositoryNotFoundError):
                return StoreError(f"repository {self.repo_id} was not found or is not accessible: create it "
                                  f"(hf repo create {self.repo_id}) and check that the token (HF_TOKEN or "
                                  "`hf auth login`) may write to it")
            if isinstance(seen, RevisionNotFoundError):
                return StoreError(f"revision {self.revision!r} does not exist in {self.repo_id}")
            if isinstance(seen, HfHubHTTPError) and seen.response is not None:
                status = seen.response.status_code
                if status in (409, 412):  # a commit whose parent is no longer the branch's head
                    return WriteConflict(f"the branch moved since the commit it names (HTTP {status})")
                if status in (408, 429) or status >= 500:
                    return Transient(f"HTTP {status}")
                if status == 401:
                    return StoreError("the Hub rejected the token (HTTP 401): check HF_TOKEN or `hf auth login`")
                if status == 403:
                    return StoreError(f"the token may not write to {self.repo_id} (HTTP 403): use a token with "
                                      "write access to it")
                return StoreError(self._scrub(f"HTTP {status}: {str(seen).splitlines()[0]}"))
            if isinstance(seen, hubhttp.transport_errors()):
                return Transient(self._scrub(f"{type(seen).__name__}: {seen}"))
            seen = seen.__cause__ or seen.__context__
        return e

    def _bound_timeout(self) -> None:
        # The library's shared client waits forever by default, and create_commit and its uploads pass no
        # timeout of their own: bound it (again before every call, since the library may rebuild the client).
        client = get_session()
        if client.timeout != self.timeout:
            client.timeout = self.timeout

    def _call(self, fn, what: str):
        self._bound_timeout()
        out = call(fn, what, self.describe(), self._classify, self.retry)
        self._reached = True  # the Hub has answered: its name resolves
        return out

    def _url(self, key: str) -> str:
        prefix = {"model": "", "dataset": "datasets/"}[self.repo_type]
        return (f"{self.endpoint}/{prefix}{self.repo_id}/resolve/{quote(self.revision, safe='')}/"
                f"{quote(safe_key(key))}")

    def _get(self, key: str, headers: dict | None = None, stream: bool = False):
        req = get_session().build_request("GET", self._url(key), headers={**build_hf_headers(token=self._token),
                                                                           **(headers or {})}, timeout=self.timeout)
        return get_session().send(req, follow_redirects=True, stream=stream)

    def fence(self, on_moved: Callable[[], str]) -> None:
        """Fence every later commit of this client: each names as its parent the commit this client made last, so
        the Hub refuses it (412) once anyone else has committed. ``on_moved`` then decides: it raises (Fenced)
        when this client may no longer write (the run's lease is another session's), or returns the commit at
        which it found that it still may, which the commit is retried on. A checkpoint's files, the pointer, a
        deletion: no commit lands after another session took the run over."""
        self._on_moved = on_moved

    def unchained(self) -> HubStore:
        """This store without the fence: for the one record a fenced session still writes (its ledger's end)."""
        other = copy.copy(self)
        other._on_moved, other._last, other._line, other._line_lock = None, None, set(), threading.Lock()
        return other

    def _create(self, ops: builtins.list, message: str, parent: str | None) -> str:
        info = self.api.create_commit(self.repo_id, ops, commit_message=message, repo_type=self.repo_type,
                                      revision=self.revision, parent_commit=parent)
        return str(info.oid)

    def _advance(self, parent: str | None, oid: str) -> None:
        with self._line_lock:
            if parent is not None and parent == self._last:
                self._line.add(oid)
            else:
                self._line = {oid} if parent is None else {parent, oid}
            self._last = oid

    def _commit(self, ops_factory, message: str, what: str) -> None:
        # Operations are rebuilt for each attempt: the client refuses to reuse a committed one.
        on_moved = self._on_moved
        parent = None
        if on_moved is not None:
            parent = self._last or on_moved()
        try:
            oid = self._call(lambda: self._create(ops_factory(), message, parent), what)
        except WriteConflict:
            if on_moved is None:
                raise
            parent = on_moved()  # raises unless this client may still write; a second conflict is an error
            oid = self._call(lambda: self._create(ops_factory(), message, parent), what)
        self._advance(parent, oid)

    def check_write_access(self) -> None:
        """Refuse, before any upload, a token the Hub says may not write to this repository.

        The Hub's whoami names the token's role: ``read``, ``write``, or ``fineGrained`` with permissions per
        user, organization or repository. Only a verdict the answer states outright is acted on: a server
        without whoami, an answer of another shape, an organization's member roles or a network failure
        leave the question to the first upload (a 403 there is reported the same way).
        """
        if not self._token:
            return  # no token at all: the first request says so (401), as for a read
        self._bound_timeout()
        try:
            info = self.api.whoami(token=self._token)
        except Exception:  # noqa: BLE001 - no verdict (a token rejected outright, network, an old server): the
            return  # store's own first request reports it, with what it was doing
        auth = info.get("auth") if isinstance(info, dict) else None
        access = auth.get("accessToken") if isinstance(auth, dict) else None
        denied = _denied(access, self.repo_id, self.repo_type) if isinstance(access, dict) else ""
        if denied:
            raise StoreError(f"the token may not write to {self.repo_id} ({denied}): use a token with write access "
                             "to it (HF_TOKEN or `hf auth login`)")

    # ------------------------------------------------------------------------------- protocol
    def put_file(self, local: Path, key: str, sha256: str, create: bool = False) -> str:
        self.put_files([(local, key, sha256)])
        return sha256

    def put_files(self, items: list[tuple[Path, str, str]]) -> None:
        def ops():
            out = []
            for local, key, sha in items:
                op = CommitOperationAdd(path_in_repo=safe_key(key), path_or_fileobj=str(local))
                op.upload_info.sha256 = bytes.fromhex(sha)  # known already: no second pass over the file
                out.append(op)
            return out

        where = os.path.commonpath([k for _, k, _ in items]) if items else ""
        self._commit(ops, f"baton: upload {where}", f"upload of {where}")

    def _tree(self, folder: str):
        try:
            return list(self.api.list_repo_tree(self.repo_id, path_in_repo=folder or None, recursive=True,
                                                repo_type=self.repo_type, revision=self.revision))
        except HfHubHTTPError as e:
            if e.response is not None and e.response.status_code == 404 and \
                    e.response.headers.get("X-Error-Code") == "EntryNotFound":
                return []
            raise

    def list(self, prefix: str, checksums: bool = True) -> dict[str, ObjectInfo]:
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        entries = self._call(lambda: self._tree(folder), f"listing of {prefix or '/'}")
        out: dict[str, ObjectInfo] = {}
        for e in entries:
            if not isinstance(e, hf.hf_api.RepoFile) or not e.path.startswith(prefix):
                continue
            if e.lfs is not None:
                out[e.path] = ObjectInfo(e.path, e.size, e.lfs.sha256, "Hub LFS sha256 (lfs.oid of the tree listing)")
            elif checksums:
                out[e.path] = ObjectInfo(e.path, e.size, *self._regular_sha(e.path, e.blob_id))
            else:
                out[e.path] = ObjectInfo(e.path, e.size, None)
        return out

    def _regular_sha(self, key: str, git_oid: str) -> tuple[str | None, str]:
        """A plain git file: download it, prove it is the listed blob, hash it."""
        def get() -> bytes:
            r = self._get(key)
            hf_raise_for_status(r)
            return r.content

        data = self._call(get, f"download of {key}")
        if _git_oid(data) != git_oid:
            return None, f"downloaded bytes do not match the listed git oid {git_oid[:12]}"
        return hashlib.sha256(data).hexdigest(), "sha256 of the plain git file, downloaded and matched to its git oid"

    def read_range(self, key: str, start: int, end: int) -> RangeRead:
        def read() -> RangeRead:
            r = self._get(key, {"Range": f"bytes={start}-{end}"})
            if r.status_code == 404:
                raise StoreError(f"{key} not found in {self.describe()}")
            hf_raise_for_status(r)
            return RangeRead(r.content, r.status_code, r.headers.get("Content-Range"))

        return self._call(read, f"ranged read of {key}")

    def get_file(self, key: str, local: Path) -> None:
        def get() -> None:
            r = self._get(key, stream=True)
            try:
                if r.status_code == 404:
                    raise StoreError(f"{key} not found in {self.describe()}")
                hf_raise_for_status(r)
                write_download(local, r.iter_bytes(8 << 20))
            finally:
                r.close()

        self._call(get, f"download of {key}")

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: builtins.list[str]) -> None:  # `list` here is the method
        if not keys:
            return
        folder = str(PurePosixPath(os.path.commonpath(keys)))
        present = self.list(folder + "/" if folder not in keys else folder, checksums=False)
        gone = [k for k in keys if k in present]  # deleting an absent file is not an error
        if gone:
            self._commit(lambda: [CommitOperationDelete(path_in_repo=safe_key(k)) for k in gone],
                         f"baton: delete {folder}", f"delete of {folder}")

    def read_text(self, key: str) -> str | None:
        def read() -> bytes | None:
            r = self._get(key)
            if r.status_code == 404 and r.headers.get("X-Error-Code") != "RepoNotFound":
                return None
            hf_raise_for_status(r)
            return r.content

        return decode_text(self._call(read, f"read of {key}"), key, self.describe())

    def write_text(self, key: str, text: str) -> None:
        data = text.encode("utf-8")
        self._commit(lambda: [CommitOperationAdd(path_in_repo=safe_key(key), path_or_fileobj=data)],
                     f"baton: write {key}", f"write of {key}")

    # ------------------------------------------------------------------------ conditional writes
    def _head(self) -> str:
        info = self._call(lambda: self.api.repo_info(self.repo_id, revision=self.revision, repo_type=self.repo_type),
                          f"head of {self.revision}")
        return str(info.sha)

    def read_versioned(self, key: str) -> Versioned | None:
        """The file as the branch holds it now; its version is the commit it was served from (X-Repo-Commit), the
        parent a conditional write names. The Hub tells no age cheaply: None (expiry is then watched for)."""
        def read() -> Versioned | None:
            r = self._get(key)
            if r.status_code == 404 and r.headers.get("X-Error-Code") != "RepoNotFound":
                return None
            hf_raise_for_status(r)
            commit = r.headers.get("X-Repo-Commit")
            if not commit:
                raise StoreError(f"the Hub named no commit (X-Repo-Commit) for {key}")
            text = decode_text(r.content, key, self.describe())
            assert text is not None
            return Versioned(text, commit, None)

        return self._call(read, f"read of {key}")

    def write_if(self, key: str, text: str, version: str | None) -> str:
        """A commit whose parent is ``version`` (the commit ``read_versioned`` saw): the Hub refuses it (412) once the
        branch has moved. Any commit moves it, so a conflict says only that something changed since: the caller
        reads again and retries when what it cares about is still as it left it. A create reads the branch's head
        and commits on it only if the file is absent there."""
        data = text.encode("utf-8")
        parent = version
        with self._line_lock:
            if version is not None and version in self._line:
                parent = self._last  # every commit since ``version`` is this client's own: none moved ``key``
        if parent is None:
            parent = self._head()
            if self._get_at(key, parent) is not None:
                raise WriteConflict(f"{key} in {self.describe()} exists already")

        def commit() -> str:
            return self._create([CommitOperationAdd(path_in_repo=safe_key(key), path_or_fileobj=data)],
                                f"baton: write {key}", parent)

        self._bound_timeout()
        try:
            oid = call(commit, f"conditional write of {key}", self.describe(), self._classify, self.retry)
            self._advance(parent, oid)
            return oid
        except WriteConflict:
            now = self.read_versioned(key)
            if now is not None and now.text == text:
                return now.version  # our own commit, retried after its answer was lost
            raise WriteConflict(f"{key} in {self.describe()}: the branch moved since commit {parent[:12]}") from None

    def _get_at(self, key: str, commit: str) -> bytes | None:
        def read() -> bytes | None:
            prefix = {"model": "", "dataset": "datasets/"}[self.repo_type]
            url = f"{self.endpoint}/{prefix}{self.repo_id}/resolve/{commit}/{quote(safe_key(key))}"
            req = get_session().build_request("GET", url, headers=build_hf_headers(token=self._token),
                                              timeout=self.timeout)
            r = get_session().send(req, follow_redirects=True)
            if r.status_code == 404 and r.headers.get("X-Error-Code") != "RepoNotFound":
                return None
            hf_raise_for_status(r)
            return r.content

        return self._call(read, f"read of {key} at {commit[:12]}")
