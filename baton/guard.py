"""The boundary of every command: each path a person gives and each number flag, checked before any work.

Paths: an input must exist and be of the kind the command reads (a file or a folder). An output must be a
folder (or a place where one can be made) on a writable disk, and never inside a place that belongs to
something else: the store's folder (only the checkpoint cycle writes there: an export once overwrote a
verified checkpoint's weights), the run's folder or the data folder, unless writing there is the command's
job. An output that already holds files is refused unless the command was given ``--force``. The store,
the run folder and the data folder themselves must not nest in one another, and each must be a folder.

Numbers: argparse types that refuse NaN, infinities and counts that make no sense, so a flag fails in the
same one line as the config does.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BatonError

if TYPE_CHECKING:
    from .config import Config


class PathError(BatonError):
    """A path of the wrong kind, in the wrong place, or on a disk that cannot take a write."""


def resolved(path: str | Path) -> Path:
    """Absolute, with symlinks followed: two spellings of one folder compare equal."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def input_file(path: str | Path, what: str, fix: str) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        raise PathError(f"{what} {p} is a folder, not a file ({fix})")
    if not p.is_file():
        raise PathError(f"{what} {p} not found ({fix})" if not p.exists() else f"{what} {p} is not a regular file ({fix})")
    if not os.access(p, os.R_OK):
        raise PathError(f"{what} {p} cannot be read (no permission; {fix})")
    return p


def input_dir(path: str | Path, what: str, fix: str) -> Path:
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise PathError(f"{what} {p} is a file, not a folder ({fix})")
    if not p.is_dir():
        raise PathError(f"{what} {p} does not exist ({fix})")
    return p


def file_url_problem(url: str, key: str) -> str | None:
    """What is wrong with a file:// URL that names no absolute path, else None. After ``file://`` comes a host:
    file://rel/x is host "rel", path "/x", and taking it as the relative folder rel/x would be a guess."""
    if not url.startswith("file://") or url.startswith("file:///"):
        return None
    shown = url if "@" not in url else "file://…"  # never echo what may be credentials
    return (f"{key} {shown} is a file:// URL without an absolute path (what follows file:// is read as a host): "
            "write file:///absolute/path or a plain path")


def local_store_root(url: str, key: str = "store.url") -> Path | None:
    """The folder of a local store; None for a remote one."""
    if url.startswith(("s3://", "hf://")) or ("://" in url and not url.startswith("file://")):
        return None
    if problem := file_url_problem(url, key):
        raise PathError(problem)
    return Path(url.removeprefix("file://"))


def places(cfg: Config) -> list[tuple[str, str, Path]]:
    """(name, config key, folder) of the places a config owns: the local store, the run folder, the data folder."""
    out = []
    root = local_store_root(cfg.store.url)
    if root is not None:
        out.append(("the store's folder", "store.url", root))
    out.append(("the run folder", "run.local_dir", cfg.run_dir))
    out.append(("the data folder", "data.dir", Path(cfg.data.dir)))
    return out


def check_layout(cfg: Config, writes: tuple[str, ...] = ()) -> None:
    """The store's, the run's and the data's folders: each a folder (or not yet made), none inside another;
    those whose config keys are in ``writes`` (the command writes there) on a disk that takes a write."""
    named = places(cfg)
    for name, key, folder in named:
        p = Path(folder).expanduser()
        if p.exists() and not p.is_dir():
            raise PathError(f"{name} {p} ({key}) is a file, not a folder (set {key} to a folder)")
        above = _nearest_existing(p)
        if not above.is_dir():
            raise PathError(f"{name} {p} ({key}) cannot be made: {above} is a file, not a folder (set {key} to a "
                            "folder)")
        if key in writes:  # found now, not after a session's training when its first checkpoint is saved
            _writable_place(p, f"{name} {p} ({key})", f"set {key} to a folder on a writable disk")
    for i, (a, ka, fa) in enumerate(named):
        for b, kb, fb in named[i + 1 :]:
            ra, rb = resolved(fa), resolved(fb)
            if _inside(ra, rb) or _inside(rb, ra):
                inner, outer = (a, ka, ra), (b, kb, rb)
                if _inside(rb, ra):
                    inner, outer = outer, inner
                raise PathError(f"{inner[0]} {inner[2]} lies inside {outer[0]} {outer[2]}: nothing but checkpoints "
                                f"may live in the store, and the run's and the data's files must not mix (set "
                                f"{inner[1]} or {outer[1]} to a separate folder)")
    root = local_store_root(cfg.store.url)
    # Where baton publishes (the dataset, the model) is written by publishing: never the checkpoint store's folder.
    for key, url in (("data.url", cfg.data.url), ("publish.url", cfg.publish.url)):
        target = local_store_root(url, key) if url else None
        if root is None or target is None:
            continue
        if _inside(resolved(target), resolved(root)) or _inside(resolved(root), resolved(target)):
            raise PathError(f"{key} {target} overlaps the store's folder {root} (store.url): nothing but checkpoints "
                            f"may live in the store (set {key} to a separate folder)")


def output_dir(path: str | Path, flag: str, cfg: Config | None = None, force: bool = False,
               own: tuple[str, ...] = ()) -> Path:
    """An output folder given by ``flag``: not inside the store, the run or the data folder (except those
    named in ``own``), a folder if it exists, empty unless ``force``, on a writable disk."""
    p = Path(path).expanduser()
    if cfg is not None:
        here = resolved(p)
        for name, key, folder in places(cfg):
            if name not in own and _inside(here, resolved(folder)):
                raise PathError(f"{flag} {p} is inside {name} {folder} ({key}); only "
                                f"{'the checkpoint cycle writes there' if key == 'store.url' else 'baton itself writes there'}"
                                f": choose a folder outside it")
    if p.exists():
        if not p.is_dir():
            raise PathError(f"{flag} {p} is a file, not a folder (choose a new folder)")
        if not force and any(p.iterdir()):
            raise PathError(f"{flag} {p} already holds files (pass --force to write over them, or choose a new folder)")
    _writable_place(p, f"{flag} {p}", "choose another place")
    return p


def _nearest_existing(p: Path) -> Path:
    q = Path(os.path.abspath(p))
    while not q.exists():
        q = q.parent
    return q


def _writable_place(p: Path, what: str, fix: str) -> None:
    """The nearest existing folder at or above ``p`` must be a folder this process may write into."""
    q = _nearest_existing(p)
    if not q.is_dir():
        raise PathError(f"{what} cannot be made: {q} is a file, not a folder ({fix})")
    if not os.access(q, os.W_OK | os.X_OK):
        raise PathError(f"{what} cannot be written: no permission to write in {q} ({fix})")
    # Permission bits do not tell all (a read-only mount, /proc, a full quota, root's access() that says yes to
    # everything): a folder made and removed at once does.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".baton-probe-", dir=q))
    except OSError as e:
        raise PathError(f"{what} cannot be written: making a folder in {q} failed ({e.strerror}) ({fix})") from None


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
