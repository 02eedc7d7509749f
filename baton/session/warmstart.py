"""A session's start-up: the compile cache carried with the run, and the clock that splits the start-up into
pull, build, compile and first step for the ledger.

The compile cache (``runtime.compile_cache``, ``runtime.compile_store``): pulled by each node's first process in
a thread started as soon as the store is open, so it downloads while the data and the checkpoint do; waited for
and loaded by every process after the resume, before anything compiles; pushed by rank 0 after the first
compiled step of a session that compiled cold, in a thread of its own while training goes on. Nothing here
ends a session: a missing, damaged, truncated or foreign blob, a torch without the API, a failed push are each
one line in the log and the run summary, and the session compiles cold.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..planning.ledger import StartupSplit
from ..reads import one_line
from ..runtime import compile_cache as cc
from ..runtime import compile_store, dist
from ..runtime.compiled import compiled_parts
from ..store import Store, delete_keys

log = logging.getLogger(__name__)


class StartupClock:
    """Where a session's time went before it trained: pulling (data, checkpoint, compile cache), building (the
    rest before the first step), and the first step, whose excess over the second is the compile."""

    def __init__(self, t_start: float):
        self.t_start = t_start
        self.pull = 0.0  # seconds spent pulling, added up by whoever pulls
        self.t_steps: float | None = None  # when the first step began
        self.first: float | None = None  # the first step's seconds
        self.second: float | None = None

    def stepping_begins(self) -> None:
        if self.t_steps is None:
            self.t_steps = time.time()

    def observe(self, step_seconds: float) -> bool:
        """A step's seconds, for the first two steps; True when the split changed."""
        if self.first is None:
            self.first = step_seconds
            return True
        if self.second is None:
            self.second = step_seconds
            return True
        return False

    def split(self, compile_kind: str, note: str | None) -> StartupSplit | None:
        if self.t_steps is None or self.first is None:
            return None
        before = max(0.0, self.t_steps - self.t_start)
        pull = min(self.pull, before)
        excess = max(0.0, self.first - self.second) if self.second is not None else None
        return StartupSplit(pull=round(pull, 3), build=round(before - pull, 3), first_step=round(self.first, 3),
                            compile=compile_kind,
                            compile_seconds=round(excess, 3) if excess is not None and compile_kind != "off" else None,
                            note=note)


class CompileCache:
    """This session's compile cache: its key, its pull, its load, its push, and what became of each."""

    def __init__(self, cfg: Config, device: torch.device, info: dist.DistInfo, run_dir: Path):
        self.run = cfg.run.name
        self.verify_mode = cfg.store.verify
        self.main = info.is_main
        self.compiled = bool(cfg.train.compile)
        self.kind = "cold" if self.compiled else "off"  # off | cold | warm, for the ledger
        self.note: str | None = None  # the one line saying what became of the pulled cache
        self.push_note: str | None = None  # and of this session's push
        self.pushed: dict[str, Any] | None = None
        self.key: str | None = None
        self.parts: dict[str, Any] = {}
        self._since = cc.now()  # C++ kernels compiled from here on are this session's
        self._pull: threading.Thread | None = None
        self._pulled: compile_store.Pulled | None = None
        self._push: threading.Thread | None = None
        self._misses = 0  # inductor's count of graphs compiled anew, when the cache was loaded
        self._placed: list[Path] = []  # the kernel files the loaded blob put into this machine's inductor cache
        self.enabled = self.compiled and cfg.train.compile_cache
        if self.enabled:
            why = cc.unavailable()
            if why:
                self.enabled, self.note = False, f"compile cache: {why}"
                if self.main:
                    log.info("%s", self.note)
        if self.enabled:
            self.parts = cc.key_parts(cfg, device, info.world)
            self.key = cc.cache_key(self.parts)
        # Where the node's first process puts the pulled blob (one per node: nodes may share a file system).
        self.path = run_dir / "compile-cache" / f"{self.key}{dist.node_suffix()}.bin" if self.key else None

    # ------------------------------------------------------------------------------------------ pull
    def start_pull(self, store: Store) -> None:
        """Each node's first process: download the blob in the background (beside the data and checkpoint)."""
        if not self.enabled or not dist.is_local_main():
            return
        key, path = self.key, self.path
        assert key is not None and path is not None

        def pull() -> None:
            try:
                self._pulled = compile_store.pull(store, self.run, key, path)
            except Exception as e:  # noqa: BLE001 - whatever goes wrong, the session compiles cold
                self._pulled = compile_store.Pulled(None, f"compile cache: the pull failed ({type(e).__name__}: "
                                                          f"{one_line(e, 200)}); compiling cold")

        self._pull = threading.Thread(target=pull, name="baton-compile-cache-pull", daemon=True)
        self._pull.start()

    def _wait(self) -> None:
        if self._pull is not None:
            self._pull.join()
            self._pull = None
        if self._pulled is not None and self._pulled.path is None:
            self.note = self._pulled.note

    def load(self) -> float:
        """Every process, before the first compile: wait for the node's pull, then load the blob when there is
        one. Returns the seconds spent waiting for the pull."""
        if not self.enabled or self.path is None:
            return 0.0
        t0 = time.time()
        dist.on_main(self._wait, local=True)
        waited = time.time() - t0
        pulled = self._pulled
        if pulled is not None and self.main:
            # No cache yet is how every run starts: said plainly. A cache that is there and unusable is a warning.
            log.log(logging.INFO if pulled.path or pulled.missing else logging.WARNING, "%s", pulled.note)
        if not self.path.is_file():  # nothing pulled (said by the node's first process)
            return waited
        try:
            said = cc.load(self.path.read_bytes(), written=self._placed)
        except (cc.CacheUnusable, OSError) as e:
            self.note = f"compile cache: {self.path.name} cannot be used ({e}); compiling cold"
            log.warning("%s", self.note)
            return waited
        self.kind, self.note = "warm", f"compile cache: loaded {said} (key {str(self.key)[:12]})"
        self._misses = cc.graphs_compiled()
        if self.main:
            log.info("%s", self.note)
        return waited

    # ------------------------------------------------------------------------------------------ push
    def after_first_step(self, store: Store, micro_loss: Any, session: str | None) -> None:
        """Rank 0, after the first compiled step of a cold compile: collect the artifacts here (a fraction of a
        second) and push them in the background."""
        if not (self.enabled and self.main) or self._push is not None:
            return
        parts = compiled_parts(micro_loss)
        if self.kind == "warm" and any(f.fell_back for f in parts):
            self._discard(store)
            return
        if self.kind == "warm":
            anew = cc.graphs_compiled() - self._misses
            if anew <= 0:
                return
            # Loaded, yet some graph was not in it: the step compiled, and the next session gets the whole set.
            self.kind = "cold"
            self.note = f"{self.note}, yet {anew} graph(s) were compiled anew"
            log.info("%s", self.note)
        if parts and all(f.fell_back for f in parts):
            self.push_note = "compile cache: nothing pushed, the compile fell back to eager"
            return
        try:
            blob = cc.collect(self._since)
            kernels = sum(not cc.is_marker(rel) for rel, _ in cc.unpack(blob)[1]) if blob else 0
        except Exception as e:  # noqa: BLE001 - a cache is an optimisation: never the session's end
            self.push_note = (f"compile cache: could not collect this session's artifacts ({type(e).__name__}: "
                              f"{one_line(e, 200)})")
            log.warning("%s", self.push_note)
            return
        if blob is None:
            self.push_note = "compile cache: torch handed over no artifacts (nothing was compiled by inductor)"
            log.info("%s", self.push_note)
            return
        key = self.key
        assert key is not None

        def push() -> None:
            t0 = time.time()
            try:
                rec = compile_store.push(store, self.run, key, self.parts, blob, kernels, self.verify_mode, session)
            except Exception as e:  # noqa: BLE001 - the next session compiles cold; this one trains on
                self.push_note = (f"compile cache: the push of {len(blob) / 2**20:.1f} MiB failed "
                                  f"({type(e).__name__}: {one_line(e, 200)}); the next session compiles cold")
                log.warning("%s", self.push_note)
                return
            self.pushed = {"key": key, "bytes": rec.size, "kernels": kernels, "seconds": round(time.time() - t0, 3)}
            self.push_note = (f"compile cache: pushed and verified {rec.size / 2**20:.1f} MiB ({kernels} C++ "
                              f"kernels) as {compile_store.blob_key(self.run, key)}")
            log.info("%s", self.push_note)

        self._push = threading.Thread(target=push, name="baton-compile-cache-push", daemon=False)
        self._push.start()

    def _discard(self, store: Store) -> None:
        """A warm session whose compile fell back to eager: what it loaded cannot be trusted. Its kernels leave this
        machine's cache (else they fail every later compile here, any run's), and its blob leaves the store (else
        every later session loads it and runs eagerly): the next session compiles cold and pushes a good one."""
        for path in self._placed:
            path.unlink(missing_ok=True)
        key = self.key
        assert key is not None
        try:
            delete_keys(store, [compile_store.blob_key(self.run, key), compile_store.record_key(self.run, key)])
            gone = f"removed {compile_store.blob_key(self.run, key)} from the store"
        except Exception as e:  # noqa: BLE001 - a cache is an optimisation: never the session's end
            gone = f"could not remove it from the store ({type(e).__name__}: {one_line(e, 200)})"
        self.kind = "cold"
        self.push_note = (f"compile cache: the compile fell back to eager after loading it, so it is not trusted: "
                          f"its {len(self._placed)} kernel file(s) removed from this machine's cache, {gone}; the "
                          "next session compiles cold")
        log.warning("%s", self.push_note)

    def finish_push(self) -> None:
        """Wait for the push in flight (bounded by the store's own retries)."""
        if self._push is not None:
            self._push.join()

    def close(self) -> None:
        """The push in flight finishes; the pulled copy goes."""
        if self._pull is not None:
            self._pull.join()
        self.finish_push()
        if self.path is not None and dist.is_local_main():
            compile_store.remove_local(self.path)

    def said(self) -> str | None:
        """What became of the cache, pulled and pushed, in one line (the ledger's)."""
        return "; ".join(n for n in (self.note, self.push_note) if n) or None

    def summary(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "kind": self.kind, "key": self.key, "note": self.note,
                "push_note": self.push_note, "pushed": self.pushed}
