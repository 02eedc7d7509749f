"""The boundary of every command: each path, URL and number a person gives, checked before any work.

A path is checked once, whatever brought it (a config key, a flag, an API argument): a string without NUL
or control characters whose parts fit the file system's name and path limits; then of the kind the command
reads (an existing file or folder), or, for an output, a folder (or a place where one can be made, never a
dangling symlink) on a disk that takes a write. A URL is split once, and a URL urllib cannot split is one
line. Messages print values escaped, never a raw control character, never credentials.

Places: an output never lands inside a place that belongs to something else (the store's folder, where only
the checkpoint cycle writes: an export once overwrote a verified checkpoint's weights; the run's folder; the
data folder: a publish there overwrote the prepared tokenizer.json), unless writing there is its job. The
store, the run folder and the data folder themselves must not nest in one another, and each must be a folder.

Numbers: argparse types that refuse NaN, infinities and counts that make no sense, so a flag fails in the
same one line as the config does.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, unquote, urlsplit

from .errors import BatonError, ConfigError

if TYPE_CHECKING:
    from .config import Config


class PathError(BatonError):
    """A path of the wrong kind, in the wrong place, or on a disk that cannot take a write."""


def escaped(text: str, keep: str = "") -> str:
    """``text`` with every character a terminal would not print as itself (control and format characters,
    undecodable bytes) written as its escape; those in ``keep`` stay."""
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


# user:password@ (or token@) after a scheme, wherever a library's message quotes a URL it was given
_URL_CREDENTIALS = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^\s/@]+@")


def without_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by '…' (a library's error quoting an endpoint
    taken from the environment, say), so it can be printed, logged and kept in a store."""
    return _URL_CREDENTIALS.sub(r"\1…@", text)


def shown(value: object, limit: int = 200) -> str:
    """A value as an error line prints it: escaped, long ones cut."""
    text = escaped(str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------------------------ paths


def _limit(p: Path, name: str, default: int) -> int:
    q = Path(os.path.abspath(p))
    while not os.path.exists(q) and q != q.parent:  # os.path says False where Path.exists() raises (too long)
        q = q.parent
    try:
        return os.pathconf(q, name)
    except (OSError, ValueError):
        return default


def path_problem(value: object) -> str | None:
    """What makes ``value`` no path this file system can hold, else None: said before any call that would
    raise for it (a NUL is a ValueError, a long name an OSError, in whichever call meets it first)."""
    if not isinstance(value, (str, os.PathLike)):
        return f"must be a path (text), got {type(value).__name__}"
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        return "is empty" if isinstance(text, str) else "must be a path as text, not bytes"
    if "\0" in text:
        return "holds a NUL byte"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "holds a control character"
    try:  # bytes that are no UTF-8 arrive as surrogates; Rust-backed libraries (tokenizers) refuse such paths
        raw = text.encode("utf-8")
    except UnicodeError:
        return "holds bytes that are not UTF-8 text"
    p = _expanded(text)
    longest = max((len(part.encode()) for part in p.parts), default=0)
    if longest > (most := _limit(p, "PC_NAME_MAX", 255)):
        return f"has a name of {longest} bytes; the file system takes at most {most}"
    # The length the system calls see: a relative path is joined to the working folder first.
    full = max(len(raw), len(os.path.abspath(p).encode("utf-8", "surrogateescape")))
    if full >= (most := _limit(p, "PC_PATH_MAX", 4096)):
        return f"is {full} bytes long as a full path; the file system takes paths under {most}"
    return None


def _expanded(text: str) -> Path:
    # os.path leaves "~nobody" as it is where Path.expanduser() raises RuntimeError.
    return Path(os.path.expanduser(text))


def path_value(value: object, what: str, fix: str) -> Path:
    """``value`` as a Path (``~`` expanded), or the PathError that says why it cannot be one."""
    if problem := path_problem(value):
        raise PathError(f"{what} {shown(value)} {problem} ({fix})")
    return _expanded(os.fspath(value))  # type: ignore[call-overload]


def resume_folder(value: object) -> Path | None:
    """``--resume``: None for ``auto`` and ``never``, else the checkpoint folder it names, which must be one."""
    if value in ("auto", "never"):
        return None
    fix = "use auto, never or a folder"
    p = path_value(value, "--resume", fix)
    if not p.is_dir():
        raise BatonError(f"--resume {shown(value)}: no such checkpoint folder ({fix})")
    return p


def input_path(value: object, what: str, fix: str, folder: bool = False) -> Path:
    """An existing file (or ``folder``) this process may read."""
    p = path_value(value, what, fix)
    kind = "folder" if folder else "file"
    if not p.exists():
        raise PathError(f"{what} {shown(p)} {'does not exist' if folder else 'not found'} ({fix})")
    if p.is_dir() != folder:
        raise PathError(f"{what} {shown(p)} is a {'file' if folder else 'folder'}, not a {kind} ({fix})")
    if not folder and not p.is_file():
        raise PathError(f"{what} {shown(p)} is not a regular file ({fix})")
    if not os.access(p, os.R_OK):
        raise PathError(f"{what} {shown(p)} cannot be read (no permission; {fix})")
    return p


def output_place(value: object, what: str, fix: str, write: bool = True, key: str = "") -> Path:
    """A folder that is there or can be made: not a file, not a dangling symlink, under folders only; with
    ``write``, on a disk that takes a write (probed: a folder made and removed). ``key``: the config key
    named after the path."""
    p = path_value(value, what, fix)
    what = f"{what} {shown(p)}" + (f" ({key})" if key else "")
    if p.is_symlink() and not p.exists():  # mkdir would say "File exists" of a path that does not
        raise PathError(f"{what} is a symlink to {shown(os.readlink(p))}, which does not exist ({fix})")
    if p.exists() and not p.is_dir():
        raise PathError(f"{what} is a file, not a folder ({fix})")
    q = Path(os.path.abspath(p))
    while not q.exists():
        if q.is_symlink():
            raise PathError(f"{what} cannot be made: {shown(q)} is a dangling symlink ({fix})")
        q = q.parent
    if not q.is_dir():
        raise PathError(f"{what} cannot be made: {shown(q)} is a file, not a folder ({fix})")
    if write:
        if not os.access(q, os.W_OK | os.X_OK):
            raise PathError(f"{what} cannot be written: no permission to write in {shown(q)} ({fix})")
        # Permission bits do not tell all (a read-only mount, /proc, a full quota, root's access() that says yes
        # to everything): a folder made and removed at once does.
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".baton-probe-", dir=q))
        except OSError as e:
            raise PathError(f"{what} cannot be written: making a folder in {shown(q)} failed "
                            f"({e.strerror}) ({fix})") from None
    return p


def resolved(path: str | Path) -> Path:
    """Absolute, with symlinks followed: two spellings of one folder compare equal."""
    return Path(os.path.realpath(_expanded(os.fspath(path))))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# ------------------------------------------------------------------------------------ URLs


def split_url(url: str, key: str, fix: str = "check its brackets and its port") -> SplitResult:
    """``url`` split once; whatever urllib cannot split (an unclosed IPv6 bracket, a port that is no number)
    is a ConfigError naming ``key``, with the URL shown without what may be credentials."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # parsed on access
    except ValueError as e:
        shown_url = url if "@" not in url else url.split("://", 1)[0] + "://…"
        raise ConfigError(f"{key} {shown(shown_url)} is not a valid URL ({shown(e)}; {fix})") from None
    return parts


# Endpoints libraries read from the environment: huggingface_hub splits HF_ENDPOINT when it is imported.
ENDPOINT_VARIABLES = {"HF_ENDPOINT": "the Hub endpoint (HF_ENDPOINT)", "AWS_ENDPOINT_URL": "the S3 endpoint",
                      "AWS_ENDPOINT_URL_S3": "the S3 endpoint"}


def check_environment() -> None:
    """The endpoint variables split as URLs, before any library that reads them is imported."""
    for name, what in ENDPOINT_VARIABLES.items():
        if os.environ.get(name):
            split_url(os.environ[name], what, f"fix or unset {name}")


def has_credentials(url: str, key: str) -> bool:
    """Whether ``url`` (or a URL in its query, an endpoint) carries user:password@."""
    if "://" not in url:
        return False
    from urllib.parse import parse_qs

    parts = split_url(url, key)
    inner = [split_url(v, f"{key}'s endpoint").netloc for vs in parse_qs(parts.query).values() for v in vs if "://" in v]
    return any("@" in netloc for netloc in [parts.netloc, *inner])


def local_store_root(url: str, key: str = "store.url") -> Path | None:
    """The folder of a local store (a path or file:///path); None for a remote one (a URL urllib splits)."""
    if "://" in url:
        split_url(url, key)
    if url.startswith(("s3://", "hf://")) or ("://" in url and not url.startswith("file://")):
        return None
    if url.startswith("file://") and not url.startswith("file:///"):
        # After file:// comes a host: file://rel/x is host "rel", path "/x"; taking it as rel/x would be a guess.
        shown_url = url if "@" not in url else "file://…"  # never echo what may be credentials
        raise ConfigError(f"{key} {shown(shown_url)} is a file:// URL without an absolute path (what follows "
                          "file:// is read as a host): write file:///absolute/path or a plain path")
    # A file:// URL's path is percent-encoded (file:///My%20Drive is the folder "My Drive"); a plain path is as typed.
    path = unquote(url.removeprefix("file://")) if url.startswith("file://") else url
    return path_value(path, key, f"set {key} to a folder")


# The config's keys that name local paths (a list's items each), and those that name a path or a URL.
PATH_KEYS = ("data.dir", "run.local_dir", "data.tokenizer", "eval.task_dir", "eval.files", "data.decontaminate")
URL_KEYS = ("store.url", "data.url", "publish.url")


def config_problems(cfg: Any) -> list[str]:
    """Every path and URL of a config as text a file system and urllib take (nothing is read or made here)."""
    out = []
    values: list[tuple[str, Any]] = []
    for key in PATH_KEYS:
        section, name = key.split(".")
        v = getattr(getattr(cfg, section), name)
        values += [(f"{key}[{i}]", x) for i, x in enumerate(v)] if isinstance(v, list) else [(key, v)]
    values += [(f"data.sources[{i}].path", s.path) for i, s in enumerate(cfg.data.sources)]
    for key, v in values:
        if v != "" and (problem := path_problem(v)):
            out.append(f"{key} {shown(v)} {problem} (give {key} a path the file system takes)")
    for key in (*URL_KEYS, "log.mlflow_uri"):
        section, name = key.split(".")
        url = getattr(getattr(cfg, section), name)
        try:
            if url and key in URL_KEYS:
                local_store_root(url, key)  # credentials in a URL are the config's rule (config._url_problems)
            elif "://" in url:
                split_url(url, key)
        except BatonError as e:
            out.append(str(e))
    return out


# ------------------------------------------------------------------------------------ places


def places(cfg: Config) -> list[tuple[str, str, Path]]:
    """(name, config key, folder) of the places a config owns: the local store, the run folder, the data folder."""
    out = []
    root = local_store_root(cfg.store.url)
    if root is not None:
        out.append(("the store's folder", "store.url", root))
    out.append(("the run folder", "run.local_dir", cfg.run_dir))
    out.append(("the data folder", "data.dir", Path(cfg.data.dir)))
    return out


def outside_places(p: Path, what: str, cfg: Config, own: tuple[str, ...] = ()) -> None:
    """The place rule of every output: never inside the store's, the run's or the data's folder (nor holding
    the store's), except the places named in ``own``, where writing is the output's job."""
    here = resolved(p)
    for name, key, folder in places(cfg):
        there = resolved(folder)
        if name in own or not (_inside(here, there) or (key == "store.url" and _inside(there, here))):
            continue
        who = "the checkpoint cycle writes there" if key == "store.url" else "baton itself writes there"
        raise PathError(f"{what} {shown(p)} {'is inside' if _inside(here, there) else 'holds'} {name} "
                        f"{shown(folder)} ({key}); only {who}: choose a folder outside it")


def check_layout(cfg: Config, writes: tuple[str, ...] = ()) -> None:
    """The store's, the run's and the data's folders: each a folder (or not yet made), none inside another;
    those whose config keys are in ``writes`` (the command writes there) on a disk that takes a write
    (found now, not after a session's training when its first checkpoint is saved). Then the local places
    baton publishes to: outside those folders (data.url may be the data folder itself, used where it lies),
    folders or places for one, probed for a write when in ``writes`` too."""
    named = places(cfg)
    for name, key, folder in named:
        fix = f"set {key} to a folder" + (" on a writable disk" if key in writes else "")
        output_place(folder, name, fix, key in writes, key)
    for i, (a, ka, fa) in enumerate(named):
        for b, kb, fb in named[i + 1 :]:
            ra, rb = resolved(fa), resolved(fb)
            if _inside(ra, rb) or _inside(rb, ra):
                (inner, ki, ri), (outer, ko, ro) = ((b, kb, rb), (a, ka, ra)) if _inside(rb, ra) else \
                    ((a, ka, ra), (b, kb, rb))
                raise PathError(f"{inner} {shown(ri)} lies inside {outer} {shown(ro)}: nothing but checkpoints may "
                                f"live in the store, and the run's and the data's files must not mix (set {ki} or "
                                f"{ko} to a separate folder)")
    for key, url in (("data.url", cfg.data.url), ("publish.url", cfg.publish.url)):
        target = local_store_root(url, key) if url else None
        if target is not None and not (key == "data.url" and resolved(target) == resolved(cfg.data.dir)):
            outside_places(target, key, cfg)
            output_place(target, key, f"set {key} to a folder you may write", key in writes)


def output_dir(path: object, flag: str, cfg: Config | None = None, force: bool = False,
               own: tuple[str, ...] = ()) -> Path:
    """An output folder given by ``flag``: outside the config's places (but those named in ``own``), a
    folder if it exists, empty unless ``force``, on a writable disk."""
    p = path_value(path, flag, "choose another place")
    if cfg is not None:
        outside_places(p, flag, cfg, own)
    output_place(p, flag, "choose a new folder" if p.exists() else "choose another place")
    if not force and p.is_dir() and any(p.iterdir()):
        raise PathError(f"{flag} {shown(p)} already holds files (pass --force to write over them, or choose a new "
                        "folder)")
    return p


# ------------------------------------------------------------------------------------ number flags


def finite_float(lo: float | None = None, lo_open: bool = False):
    """argparse type: a finite float, at least (or above, with ``lo_open``) ``lo``."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
        check_float(v, text, lo, lo_open)
        return v

    parse.bounds = (lo, None, lo_open)  # type: ignore[attr-defined]  # for the tests that probe every flag
    return parse


def check_float(v: float, shown: object, lo: float | None = None, lo_open: bool = False) -> None:
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{shown!r} is not a finite number")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g}, got {shown}")


def count(lo: int = 1, hi: int | None = None):
    """argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {f'between {lo} and {hi}' if hi is not None else f'>= {lo}'},"
                                             f" got {v}")
        return v

    parse.bounds = (lo, hi, False)  # type: ignore[attr-defined]
    return parse
