"""A minimal Hugging Face Hub on 127.0.0.1: the endpoints the unmodified ``huggingface_hub`` client calls for
a commit through the regular LFS path, a tree listing and a (ranged) download.

Endpoints, as the Hub serves them:
- ``POST /api/models/{repo}/preupload/{rev}``        which files go to LFS (binary or >= 10 MB) or inline
- ``POST /{repo}.git/info/lfs/objects/batch``        LFS batch API: an upload (and verify) action per object
- ``PUT  /lfs-upload/{oid}``                         the upload target; the body must hash to ``oid``
- ``POST /lfs-verify``                               LFS verify action
- ``POST /api/models/{repo}/commit/{rev}``           NDJSON commit: header, file, lfsFile, deletedFile, deletedFolder
- ``GET  /api/models/{repo}/tree/{rev}[/{path}]``    listing with size, git oid and ``lfs.oid`` (the sha256)
- ``GET|HEAD /{repo}/resolve/{rev}/{path}``         download; LFS files redirect to ``/lfs-blob/{oid}`` like
                                                     the Hub's CDN; ``Range: bytes=a-b`` answers 206
Dataset repositories (``create_repo("datasets/owner/name")``) answer the same under ``/api/datasets/`` and
``/datasets/``.
- ``POST /api/models/{repo}/branch/{branch}``        a branch starting from ``startingPoint`` (default main);
                                                     409 when it exists. Every ``{rev}`` above may name one,
                                                     or a commit (its files as that commit left them)
- ``POST /api/validate-yaml``                        the check the client asks for before committing a README.md:
                                                     its YAML front matter must parse to a mapping
- ``GET  /api/models/{repo}/revision/{rev}``         repository info: the revision's head commit and files
                                                     (what ``snapshot_download`` asks first)
- ``GET  /api/whoami-v2``                            the token's owner and its ``auth.accessToken`` (role
                                                     read, write or fineGrained with scoped permissions)
The Xet protocol is not served: the client is run with ``HF_HUB_DISABLE_XET=1``.

Auth is a bearer token; a wrong one gets the Hub's 401 "Invalid credentials". ``token`` may write; ``add_token``
makes others, described by whoami as given, that may only read unless told otherwise: their writes (preupload,
LFS batch, commit, branch) get the Hub's 403. Test hooks (``corrupt``,
``remove``, ``read``) change what the server holds behind the client's back; ``put`` commits files directly
(a dataset repository for the data tests), ``stall`` hangs one download halfway, ``gated`` answers a
repository's reads with the 403 of a gated repository, and ``requests`` logs every request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from support.store_servers import LocalHTTPServer, read_chunked

LFS_MIN = 10 << 20


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Entry:
    data: bytes | None  # regular files keep their bytes here; LFS files point into the blob store
    lfs_oid: str | None
    size: int
    blob_key: str | None = None  # where the LFS bytes are (the oid, unless a test damaged this file's copy)

    @property
    def blob(self) -> str | None:
        return self.blob_key or self.lfs_oid

    @property
    def oid(self) -> str:
        if self.lfs_oid is None:
            return git_oid(self.data or b"")
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.lfs_oid}\nsize {self.size}\n"
        return git_oid(pointer.encode())


class HubServer(LocalHTTPServer):
    def __init__(self, root: Path, token: str | None = None):
        super().__init__()
        self.root = root
        self.token = token or "hf_test_" + uuid.uuid4().hex
        self.repos: dict[str, dict[str, Entry]] = {}  # the main branch of each repository
        self.branches: dict[tuple[str, str], dict[str, Entry]] = {}  # (repo, branch) -> files, other branches
        self.blobs: dict[str, bytes] = {}
        self.commits: dict[str, int] = {}
        self.heads: dict[tuple[str, str], str] = {}  # (repo, branch) -> its newest commit
        self.snapshots: dict[str, dict[str, Entry]] = {}  # commit -> the files as it left them
        self.lock = threading.Lock()
        # token -> (whoami's auth.accessToken, whether it may write)
        self.tokens: dict[str, tuple[dict, bool]] = {self.token: ({"role": "write", "displayName": "write"}, True)}
        self.serve_whoami = True  # False: a server without the endpoint (404), as some Hub mirrors
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in arrival order
        self.stalls: dict[str, tuple[int, threading.Event]] = {}  # LFS oid -> (bytes sent, then wait for the event)
        self.gated: set[str] = set()  # repositories whose reads get the Hub's 403 for a gated repo (terms not accepted)

    # ------------------------------------------------------------------------------------ hooks
    def add_token(self, access: dict, writes: bool = False) -> str:
        """A further token whose whoami answers ``access``; ``writes``: whether the server lets it write."""
        token = "hf_test_" + uuid.uuid4().hex
        self.tokens[token] = (access, writes)
        return token

    def create_repo(self, repo: str) -> None:
        with self.lock:
            self.repos.setdefault(repo, {})
            self.commits.setdefault(repo, 0)

    def files(self, repo: str, rev: str = "main") -> dict[str, Entry]:
        return self.repos[repo] if rev == "main" else self.branches[(repo, rev)]

    def read(self, repo: str, path: str, rev: str = "main") -> bytes:
        e = self.files(repo, rev)[path]
        return e.data if e.lfs_oid is None else self.blobs[e.blob]

    def corrupt(self, repo: str, path: str, offset: int, rehash: bool = True) -> None:
        """Flip one stored byte. ``rehash``: the listing follows the new bytes (a server whose sha256 is computed
        from what it holds); else the listing keeps naming the old sha256 over changed bytes."""
        with self.lock:
            e = self.repos[repo][path]
            data = bytearray(e.data if e.lfs_oid is None else self.blobs[e.blob])
            data[offset] ^= 0xFF
            if e.lfs_oid is None:
                e.data = bytes(data)
            elif rehash:
                new = hashlib.sha256(data).hexdigest()
                self.blobs[new] = bytes(data)
                e.lfs_oid, e.blob_key = new, None
            else:  # this file's copy only: the content-addressed original stays for other repos
                e.blob_key = f"{e.lfs_oid}-damaged-{uuid.uuid4().hex[:8]}"
                self.blobs[e.blob_key] = bytes(data)

    def put(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """Commit ``files`` (added or replaced) to ``branch`` as the client would: binary or large files through
        LFS, text as git blobs; returns the commit."""
        self.create_repo(repo)
        with self.lock:
            staged = self.files(repo, branch)
            for path, data in files.items():
                if len(data) >= LFS_MIN or b"\0" in data[:512] or not _utf8(data[:512]):
                    oid = hashlib.sha256(data).hexdigest()
                    self.blobs[oid] = data
                    staged[path] = Entry(None, oid, len(data))
                else:
                    staged[path] = Entry(data, None, len(data))
            self.commits[repo] += 1
            commit = hashlib.sha1(f"{repo}:{self.commits[repo]}".encode()).hexdigest()
            self.snapshots[commit] = dict(staged)
            self.heads[(repo, branch)] = commit
        return commit

    def stall(self, repo: str, path: str, nbytes: int) -> threading.Event:
        """The next download of this LFS file sends ``nbytes`` of it, then waits for the returned event and hangs up."""
        event = threading.Event()
        self.stalls[self.repos[repo][path].blob] = (nbytes, event)
        return event

    def remove(self, repo: str, path: str) -> None:
        with self.lock:
            del self.repos[repo][path]

    # --------------------------------------------------------------------------------- serving
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        path, query = url.path, {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = _read_body(h) if h.command in ("POST", "PUT") else b""
        self.requests.append((h.command, path))
        try:
            if not path.startswith(("/lfs-blob/", "/lfs-upload/")) and not self._authorized(h):
                return self._send(h, 401, {"error": "Invalid credentials in Authorization header"},
                                  {"X-Error-Message": "Invalid credentials in Authorization header"})
            gated = next((r for r in self.gated if f"/{r}/" in path), None)
            if gated is not None:
                msg = f"Access to {gated} is restricted. You must have access to it and be authenticated to access it."
                return self._send(h, 403, {"error": msg}, {"X-Error-Code": "GatedRepo", "X-Error-Message": msg})
            if h.command == "GET" and path == "/api/whoami-v2" and self.serve_whoami:
                access, _ = self.tokens[h.headers["Authorization"].removeprefix("Bearer ")]
                return self._send(h, 200, {"type": "user", "name": "baton-test", "auth": {
                    "type": "access_token", "accessToken": access}})
            writing = (h.command == "POST" and re.search(r"/(preupload|commit|branch)/|/info/lfs/objects/batch$", path)
                       and not self.tokens[h.headers["Authorization"].removeprefix("Bearer ")][1])
            if writing:
                return self._send(h, 403, {"error": "You don't have the rights to write to this repository"},
                                  {"X-Error-Message": "You don't have the rights to write to this repository"})
            routes = [
                ("POST", r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", self._preupload),
                ("POST", r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", self._lfs_batch),
                ("PUT", r"/lfs-upload/([0-9a-f]{64})", self._lfs_upload),
                ("POST", r"/lfs-verify", self._lfs_verify),
                ("POST", r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", self._commit),
                ("POST", r"/api/models/([^/]+/[^/]+)/branch/([^/]+)", self._branch),
                ("GET", r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", self._info),
                ("POST", r"/api/validate-yaml", self._validate_yaml),
                ("GET", r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", self._tree),
                ("GET", r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self._resolve),
                ("HEAD", r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self._resolve),
                ("GET", r"/lfs-blob/([0-9a-f]{64}(?:-damaged-[0-9a-f]{8})?)", self._blob),
                ("HEAD", r"/lfs-blob/([0-9a-f]{64}(?:-damaged-[0-9a-f]{8})?)", self._blob),
            ]
            for method, pattern, fn in routes:
                # A dataset repository has the same endpoints under /api/datasets/ and /datasets/; it is held
                # here under the name "datasets/owner/name".
                for kind, pat in (("", pattern), ("datasets/", _dataset_route(pattern))):
                    m = re.fullmatch(pat, path) if pat else None
                    if m and h.command == method:
                        groups = [unquote(g) if g else g for g in m.groups()]
                        if kind and groups:
                            groups[0] = kind + groups[0]
                        return fn(h, query, body, *groups)
            self._send(h, 404, {"error": f"no route {h.command} {path}"})
        except BrokenPipeError:
            pass

    def _authorized(self, h: BaseHTTPRequestHandler) -> bool:
        return h.headers.get("Authorization", "").removeprefix("Bearer ") in self.tokens

    @staticmethod
    def _send(h, status: int, payload, headers: dict | None = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _repo(self, h, repo: str, rev: str = "main") -> dict[str, Entry] | None:
        if repo not in self.repos:
            self._send(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound",
                                                                   "X-Error-Message": "Repository not found"})
            return None
        if rev in self.snapshots:
            return dict(self.snapshots[rev])
        if rev != "main" and (repo, rev) not in self.branches:
            self._send(h, 404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound",
                                                                    "X-Error-Message": f"Invalid rev id: {rev}"})
            return None
        return self.files(repo, rev)

    def _branch(self, h, query, body, repo, branch) -> None:
        start = (json.loads(body or b"{}") or {}).get("startingPoint") or "main"
        files = self._repo(h, repo, start)
        if files is None:
            return
        with self.lock:
            if branch == "main" or (repo, branch) in self.branches:
                return self._send(h, 409, {"error": f"Reference already exists: refs/heads/{branch}"})
            self.branches[(repo, branch)] = dict(files)
            if (repo, start) in self.heads:
                self.heads[(repo, branch)] = self.heads[(repo, start)]
        self._send(h, 200, {})

    def _validate_yaml(self, h, query, body) -> None:
        import yaml

        text = json.loads(body)["content"]
        m = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
        try:
            meta = yaml.safe_load(m.group(1)) if m else {}
        except yaml.YAMLError as e:
            return self._send(h, 400, {"errors": [{"message": f"invalid YAML: {e}"}], "warnings": []})
        if not isinstance(meta, dict):
            return self._send(h, 400, {"errors": [{"message": "the metadata is not a mapping"}], "warnings": []})
        self._send(h, 200, {"errors": [], "warnings": []})

    def _head(self, repo: str, rev: str) -> str:
        return rev if rev in self.snapshots else self.heads.get((repo, rev), "0" * 40)

    def _info(self, h, query, body, repo, rev) -> None:
        files = self._repo(h, repo, rev)
        if files is None:
            return
        self._send(h, 200, {"id": repo, "modelId": repo, "sha": self._head(repo, rev), "private": False,
                            "siblings": [{"rfilename": p} for p in sorted(files)]})

    def _preupload(self, h, query, body, repo, rev) -> None:
        if self._repo(h, repo) is None:
            return
        files = []
        for f in json.loads(body)["files"]:
            sample = base64.b64decode(f["sample"])
            binary = b"\0" in sample or not _utf8(sample)
            mode = "lfs" if f["size"] >= LFS_MIN or binary else "regular"
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": None})
        self._send(h, 200, {"files": files, "commitOid": "0" * 40})

    def _lfs_batch(self, h, query, body, repo) -> None:
        if self._repo(h, repo) is None:
            return
        req = json.loads(body)
        base = f"http://{h.headers['Host']}"
        objects = []
        for o in req["objects"]:
            item = {"oid": o["oid"], "size": o["size"], "authenticated": True}
            if o["oid"] not in self.blobs:
                item["actions"] = {"upload": {"href": f"{base}/lfs-upload/{o['oid']}", "header": {}},
                                   "verify": {"href": f"{base}/lfs-verify", "header": {}}}
            objects.append(item)
        self._send(h, 200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_upload(self, h, query, body, oid) -> None:
        # The storage checks the content against its address, as the Hub's LFS storage does.
        if hashlib.sha256(body).hexdigest() != oid:
            return self._send(h, 400, {"error": "sha256 of the body does not match the object id"})
        with self.lock:
            self.blobs[oid] = body
        self._send(h, 200, {})

    def _lfs_verify(self, h, query, body) -> None:
        o = json.loads(body)
        blob = self.blobs.get(o["oid"])
        if blob is None or len(blob) != o["size"]:
            return self._send(h, 404, {"error": "object not found"})
        self._send(h, 200, {})

    def _commit(self, h, query, body, repo, rev) -> None:
        files = self._repo(h, repo, rev)
        if files is None:
            return
        ops = [json.loads(line) for line in body.splitlines() if line.strip()]
        parent = ops[0].get("value", {}).get("parentCommit") if ops and ops[0].get("key") == "header" else None
        with self.lock:
            if parent is not None and parent != self._head(repo, rev):
                # The Hub's answer to a commit whose parent is no longer the branch's head.
                msg = "A commit has happened since. Please refresh and try again."
                return self._send(h, 412, {"error": msg}, {"X-Error-Message": msg})
            staged = dict(files)
            for op in ops[1:]:
                v = op["value"]
                if op["key"] == "file":
                    data = base64.b64decode(v["content"])
                    staged[v["path"]] = Entry(data, None, len(data))
                elif op["key"] == "lfsFile":
                    blob = self.blobs.get(v["oid"])
                    if blob is None or ("size" in v and len(blob) != v["size"]):
                        return self._send(h, 422, {"error": f"LFS object {v['oid']} was not uploaded"})
                    staged[v["path"]] = Entry(None, v["oid"], len(blob))
                elif op["key"] == "deletedFile":
                    if v["path"] not in staged:
                        return self._send(h, 404, {"error": f"{v['path']} does not exist"},
                                          {"X-Error-Code": "EntryNotFound"})
                    del staged[v["path"]]
                elif op["key"] == "deletedFolder":
                    for p in [p for p in staged if p.startswith(v["path"].rstrip("/") + "/")]:
                        del staged[p]
                else:
                    return self._send(h, 400, {"error": f"unknown operation {op['key']}"})
            files.clear()
            files.update(staged)
            self.commits[repo] += 1
            oid = hashlib.sha1(f"{repo}:{self.commits[repo]}".encode()).hexdigest()
            self.snapshots[oid] = dict(staged)
            self.heads[(repo, rev)] = oid
        base = f"http://{h.headers['Host']}"
        self._send(h, 200, {"success": True, "commitOid": oid, "commitUrl": f"{base}/{repo}/commit/{oid}",
                            "hookOutput": ""})

    def _tree(self, h, query, body, repo, rev, sub) -> None:
        files = self._repo(h, repo, rev)
        if files is None:
            return
        sub = (sub or "").strip("/")
        recursive = query.get("recursive", "false").lower() in ("true", "1")
        prefix = sub + "/" if sub else ""
        with self.lock:
            items = sorted(files.items())
        if sub and sub not in files and not any(p.startswith(prefix) for p, _ in items):
            return self._send(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        out, dirs = [], set()
        for p, e in items:
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):].split("/")
            for i in range(1, len(rest)):
                d = prefix + "/".join(rest[:i])
                if (recursive or i == 1) and d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
            if len(rest) == 1 or recursive:
                entry = {"type": "file", "oid": e.oid, "size": e.size, "path": p}
                if e.lfs_oid is not None:
                    entry["lfs"] = {"oid": e.lfs_oid, "size": e.size, "pointerSize": 134}
                out.append(entry)
        self._send(h, 200, out)

    def _resolve(self, h, query, body, repo, rev, path) -> None:
        files = self._repo(h, repo, rev)
        if files is None:
            return
        e = files.get(path)
        if e is None:
            return self._send(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        if e.lfs_oid is not None:
            base = f"http://{h.headers['Host']}"
            h.send_response(302)
            # The commit rides along so the blob's answer can name it too: the client follows a redirect to the
            # same host and reads the file's commit from the final answer.
            h.send_header("Location", f"{base}/lfs-blob/{e.blob}?commit={self._head(repo, rev)}")
            h.send_header("X-Repo-Commit", self._head(repo, rev))
            h.send_header("ETag", f'"{e.lfs_oid}"')
            h.send_header("X-Linked-Etag", f'"{e.lfs_oid}"')
            h.send_header("X-Linked-Size", str(e.size))
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self._ranged(h, e.data or b"", {"ETag": f'"{e.oid}"', "X-Repo-Commit": self._head(repo, rev)})

    def _blob(self, h, query, body, oid) -> None:
        blob = self.blobs.get(oid)
        if blob is None:
            return self._send(h, 404, {"error": "no such object"})
        if h.command == "GET" and oid in self.stalls:
            nbytes, event = self.stalls.pop(oid)
            h.send_response(200)
            h.send_header("Content-Length", str(len(blob)))
            h.send_header("ETag", f'"{oid}"')
            h.end_headers()
            h.wfile.write(blob[:nbytes])
            h.wfile.flush()
            event.wait(120)
            h.close_connection = True
            return
        self._ranged(h, blob, {"ETag": f'"{oid}"', **({"X-Repo-Commit": query["commit"]} if "commit" in query else {})})

    def _ranged(self, h, data: bytes, headers: dict) -> None:
        rng = h.headers.get("Range")
        if rng is None:
            return self._send(h, 200, None, {**headers, "Accept-Ranges": "bytes"}, raw=data)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
        if not m:
            return self._send(h, 416, {"error": "bad range"})
        a = int(m.group(1))
        b = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        if a >= len(data) or a > b:
            return self._send(h, 416, {"error": "range not satisfiable"}, {"Content-Range": f"bytes */{len(data)}"})
        self._send(h, 206, None, {**headers, "Content-Range": f"bytes {a}-{b}/{len(data)}"}, raw=data[a : b + 1])


def _dataset_route(pattern: str) -> str | None:
    """The dataset-repository form of a repository route (None for routes that name no repository)."""
    if pattern.startswith(r"/api/models/"):
        return r"/api/datasets/" + pattern[len(r"/api/models/"):]
    if pattern.startswith(r"/([^/]+/[^/]+)"):
        return r"/datasets/" + pattern[1:]
    return None


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        return read_chunked(h)
    return h.rfile.read(int(h.headers.get("Content-Length") or 0))


def _utf8(sample: bytes) -> bool:
    try:
        sample.decode("utf-8")
        return True
    except UnicodeDecodeError as e:
        return e.start >= len(sample) - 3  # a character cut at the end of the 512-byte sample
