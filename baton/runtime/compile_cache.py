"""torch.compile's artifacts as one blob a run carries from session to session (``train.compile_cache``).

Every session of a relay starts on a machine whose compiler caches are empty, and pays a cold compile (78 s on
an H200 for the 22-layer reference model). torch can hand over what it compiled: after a compiled step,
``torch.compiler.save_cache_artifacts()`` returns inductor's compiled graphs, AOTAutograd's entries and the
Triton kernels as bytes, and ``load_cache_artifacts`` puts them into an empty machine's caches, so the next
compile of the same graphs finds them there. torch leaves out one thing: on the CPU inductor's kernels are C++
compiled into shared objects, and a warm start would still compile every one of them (about two thirds of a
CPU cold start). So the blob also carries those kernels, the ``.so`` files this process compiled into
inductor's cache folder, which a warm start puts back under the same names (their names hash the source and
the compiler's command line). That command line says ``-march=native``, not which instructions it meant, so the
key holds what the names do not: the CPU's feature flags, the compiler's version, the C library and the thread
count written into the kernels; a blob loads only on a machine that would have built the same ones. With them go inductor's instruction-set probes: on x86 it builds and loads a small
program for each vector extension the CPU claims before its first compile (half a warm CPU start), and keeps each
program with a ``.load_ok`` marker once it loaded. The program's name hashes its source, the extension's flags,
the C++ compiler's version and torch's, so a machine finds a carried probe only where its own would be the same
program from the same compiler against the same torch; anywhere else it probes for itself.

The blob is ``MAGIC``, the length of a JSON header, the header (every part's size and sha256), then the
parts. ``unpack`` checks all of it; any problem is a ``CacheUnusable`` with one line, and the session then
compiles cold. The key says what the artifacts were compiled for (``key_parts``): torch, Triton, the device,
the model and batch shape, precision, attention, the parallel layout and how it compiles. A blob loads only
under its own key.

What is loaded is code the session runs (torch's serialized graphs and the kernels): a store that others can
write to must not carry one (set ``train.compile_cache = false``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import re
import struct
import time
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..reads import one_line
from . import cuda

log = logging.getLogger(__name__)

FORMAT = "baton-compile-cache-v1"
MAGIC = b"baton-compile-cache\n"
_LEN = struct.Struct(">Q")
# An inductor C++ kernel in its cache folder: <2 characters>/<hash>.so or <hash>.main.so; a probe that loaded also
# has its empty marker, <hash>.so.load_ok.
# The first bytes of a shared library: ELF (Linux), Mach-O 64-bit and universal (macOS).
SHARED_LIBRARY = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")
KERNEL = re.compile(r"[a-z0-9]{2}/[a-z0-9]{20,80}(\.main)?\.so(\.load_ok)?")
MAX_KERNEL_BYTES = 256 << 20  # all the kernels of one blob; a folder shared with other work may hold more


class CacheUnusable(Exception):
    """A blob that cannot be loaded: its one-line reason."""


def unavailable() -> str | None:
    """Why this torch cannot carry its compile artifacts (one line), or None when it can."""
    comp = getattr(torch, "compiler", None)
    if comp is None or not hasattr(comp, "save_cache_artifacts") or not hasattr(comp, "load_cache_artifacts"):
        return (f"torch {torch.__version__.split('+')[0]} has no torch.compiler.save_cache_artifacts (torch 2.7 and "
                "newer carry the compile cache): every session compiles cold")
    return None


# ------------------------------------------------------------------------------------------------ the key


def key_parts(cfg: Config, device: torch.device, world: int, backend: str = "inductor") -> dict[str, Any]:
    """What the compiled code depends on, as a table: the key hashes it and the record keeps it."""
    t = cfg.train
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "device": device_identity(device),
        "model": dataclasses.asdict(cfg.model),
        "seq_len": cfg.data.seq_len,
        "micro_batch": t.micro_batch,
        "precision": t.precision,
        "fused_ce": t.fused_ce,
        "deterministic": t.deterministic,
        "parallel": t.parallel,
        "world": world,
        "compile": {"scope": t.compile_scope, "backend": backend},
        "sdpa_priority": _sdpa_priority(),
    }


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def device_identity(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        cap = cuda.capability(device)
        return {"type": "cuda", "name": cuda.name(device), "capability": f"{cap[0]}.{cap[1]}"}
    capability = None
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        pass
    # Inductor's C++ kernels are built with -march=native and a thread count written into them, against this
    # machine's compiler and C library: each is part of what the kernels are, so each is part of the key.
    return {"type": device.type, "machine": platform.machine(), "capability": capability, "flags": _cpu_flags(),
            "threads": torch.get_num_threads(), "compiler": _cpp_compiler(), "libc": "-".join(platform.libc_ver())}


def _cpp_compiler() -> str | None:
    """A digest of the C++ compiler inductor builds its CPU kernels with (its version text), None where unknown."""
    try:
        from torch._inductor import cpp_builder

        text = cpp_builder.get_compiler_version_info(cpp_builder.get_cpp_compiler())
    except Exception:  # noqa: BLE001 - no compiler, or a torch without these helpers: the key says so (None)
        return None
    return hashlib.sha256(str(text).encode()).hexdigest()[:16] if text else None


def _cpu_flags() -> str | None:
    """A digest of the CPU's feature flags (Linux), so kernels built for one CPU are keyed apart from another's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return hashlib.sha256(" ".join(sorted(line.split(":", 1)[1].split())).encode()).hexdigest()[:16]
    except OSError:
        pass
    return None


def _triton_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("triton")
    except Exception:  # noqa: BLE001 - not installed (CPU wheels), or metadata missing: no Triton code either
        return None


def _sdpa_priority() -> list[int] | None:
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    try:
        return list(get()) if get is not None else None
    except RuntimeError:
        return None


# ----------------------------------------------------------------------------------------- the container


def pack(artifacts: bytes, kernels: list[tuple[str, bytes]]) -> bytes:
    header = {"format": FORMAT, "artifacts": _entry(artifacts),
              "kernels": [{"path": path, **_entry(data)} for path, data in kernels]}
    head = json.dumps(header, sort_keys=True).encode()
    return b"".join([MAGIC, _LEN.pack(len(head)), head, artifacts, *(d for _, d in kernels)])


def _entry(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def unpack(blob: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    """(torch's artifacts, the kernels as (path, bytes)); CacheUnusable naming the first thing that is wrong."""
    if not blob.startswith(MAGIC):
        raise CacheUnusable("it is not a baton compile cache (wrong magic bytes)")
    at = len(MAGIC)
    if len(blob) < at + _LEN.size:
        raise CacheUnusable("it ends inside its header")
    (n,) = _LEN.unpack_from(blob, at)
    at += _LEN.size
    try:
        header = json.loads(blob[at:at + n].decode("utf-8"))
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format') if isinstance(header, dict) else None!r}, not {FORMAT}")
        entries = [("artifacts", header["artifacts"])] + [(str(k["path"]), k) for k in header["kernels"]]
        sizes = [entry["size"] for _, entry in entries]
        if any(type(n) is not int or n < 0 for n in sizes):
            raise ValueError("a size that is not a whole number of bytes")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise CacheUnusable(f"its header is unreadable ({e})") from None
    bad = [name for name, _ in entries[1:] if not KERNEL.fullmatch(name)]
    if bad:
        raise CacheUnusable(f"it names a kernel file outside inductor's cache layout: {bad[0]!r}")
    at += n
    if at + sum(sizes) != len(blob):
        raise CacheUnusable(f"it holds {len(blob) - at} bytes after its header, and the header lists {sum(sizes)}")
    parts = []
    for (name, entry), size in zip(entries, sizes):
        data = blob[at:at + size]
        at += size
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise CacheUnusable(f"its part {name} does not match its sha256")
        parts.append((name, data))
    return parts[0][1], parts[1:]


# ------------------------------------------------------------------------------------ torch's side of it


def inductor_cache_dir() -> Path | None:
    """The folder inductor keeps its compiled kernels in (TORCHINDUCTOR_CACHE_DIR, else its default)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        return None
    return Path(cache_dir())


def native_kernels(since: float, folder: Path | None = None) -> list[tuple[str, bytes]]:
    """The C++ kernels compiled into ``folder`` at or after ``since``, the instruction-set probes with their
    ``.load_ok`` markers among them (a probe without one did not load: not carried), up to MAX_KERNEL_BYTES."""
    folder = folder if folder is not None else inductor_cache_dir()
    out: list[tuple[str, bytes]] = []
    total = 0
    if folder is None or not folder.is_dir():
        return out
    for p in sorted(folder.glob("*/*.so")):
        rel = f"{p.parent.name}/{p.name}"
        try:
            st = p.stat()
            if not KERNEL.fullmatch(rel) or st.st_mtime < since:
                continue
            if total + st.st_size > MAX_KERNEL_BYTES:
                break
            out.append((rel, p.read_bytes()))
            total += st.st_size
            if p.with_name(p.name + ".load_ok").exists():  # a probe that loaded: its marker goes with it
                out.append((rel + ".load_ok", b""))
        except OSError:  # removed meanwhile by another process's cache upkeep: not carried
            continue
    return out


def collect(since: float) -> bytes | None:
    """This process's compile artifacts (and the C++ kernels compiled since ``since``) as one blob; None when
    it compiled nothing torch can hand over."""
    got = torch.compiler.save_cache_artifacts()
    if not got:
        return None
    return pack(got[0], native_kernels(since))


def is_marker(rel: str) -> bool:
    """A probe's ``.load_ok`` marker among a blob's kernels (not a kernel of its own)."""
    return rel.endswith(".load_ok")


def place_kernels(kernels: list[tuple[str, bytes]], folder: Path, written: list[Path] | None = None) -> int:
    """Write the carried C++ kernels into inductor's cache folder, each under its own name (one already there
    stays: the name is the hash of what it was compiled from), a probe's marker after its program. Returns how
    many kernels were written; ``written`` gets the paths (markers too), for taking them back."""
    for rel, data in kernels:
        # A kernel is loaded with dlopen when a graph runs: one that is no shared library (damaged before it was
        # packed, so its sha256 matches) would fail every compile that uses it, and stay in the cache for good.
        if not is_marker(rel) and not data.startswith(SHARED_LIBRARY):
            raise CacheUnusable(f"its kernel {rel} is not a shared library ({len(data)} bytes)")
    placed = 0
    for rel, data in kernels:
        dest = folder / rel
        if dest.exists():
            continue
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f"{dest.name}.{os.getpid()}.partial")
            tmp.write_bytes(data)
            os.replace(tmp, dest)
        except OSError as e:
            raise CacheUnusable(f"could not write its kernel {rel} into {folder} ({e})") from None
        placed += not is_marker(rel)
        if written is not None:
            written.append(dest)
    return placed


def load(blob: bytes, folder: Path | None = None, written: list[Path] | None = None) -> str:
    """Put a blob's artifacts into this machine's compile caches; returns what it held (for the log).
    CacheUnusable with one line when the blob cannot be used. ``written``: the kernel files it placed."""
    artifacts, kernels = unpack(blob)
    folder = folder if folder is not None else inductor_cache_dir()
    placed = place_kernels(kernels, folder, written) if kernels and folder is not None else 0
    # torch says it could not read them with a traceback of its own and returns None: the one line is ours.
    quiet = logging.getLogger("torch.compiler._cache")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        info = torch.compiler.load_cache_artifacts(artifacts)
    except Exception as e:  # noqa: BLE001 - whatever torch makes of foreign bytes: the session compiles cold
        raise CacheUnusable(f"torch could not load its artifacts ({type(e).__name__}: {one_line(e, 200)})") from None
    finally:
        quiet.setLevel(level)
    if info is None:
        raise CacheUnusable(f"torch could not load its artifacts (torch {torch.__version__} cannot read them)")
    counts = {k: len(v) for k, v in getattr(info, "artifacts", {}).items()}
    said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no artifacts"
    return f"{said}, {placed} C++ kernels"


def graphs_compiled() -> int:
    """Graphs inductor has compiled in this process for want of a cached one (its own counter; 0 where this torch
    keeps none): a warm start that still compiles some shows here."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["inductor"].get("fxgraph_cache_miss", 0))


def now() -> float:
    """A time to pass to ``native_kernels`` for what is compiled from here on (file times are whole seconds on
    some file systems)."""
    return time.time() - 1.0
