"""`baton bench`: what a configuration costs, measured: a grid of attention, sequence length, micro-batch,
activation checkpointing and compile, each cell timed over real optimizer steps.

Tokens per step stay fixed across the grid (accumulation = tokens_per_step / (micro x seq_len)), so every
cell is the same training run and only its speed and memory differ. The tokens are random ids: the
reader's cost is negligible next to the step, and no prepared data is needed.

Memory: on CUDA the allocator's peak (allocated and reserved); a cap is enforced by the allocator
itself (``set_per_process_memory_fraction``), so a cell over the cap raises a real out-of-memory error,
which is recorded as OOM. On CPU there is no allocator cap to set: the cell's footprint is the resident
set it adds to the process (peak RSS sampled every 2 ms during the cell, minus RSS before it), and a
cell whose estimate or measurement exceeds the cap is recorded as OOM. A cell whose estimate alone is
over the cap is not run (so an impossible cell cannot take the machine down).
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import gc
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import extras
from .config import Attn, Config, Precision
from .errors import BatonError
from .model.llama import build_model, param_count
from .model.optimizer import build_optimizer
from .runtime import cuda, fused_ce, regional
from .runtime.autotune import micro_loss_fn, resolve_precision
from .runtime.chunked_ce import chunk_rows
from .runtime.compiled import fallbacks
from .runtime.memory import is_oom

log = logging.getLogger(__name__)
GiB = 1024**3
MiB = 1024**2


@dataclass
class Cell:
    attn: Attn
    seq_len: int
    micro_batch: int
    grad_ckpt: bool
    compile: bool
    accum: int = 0
    status: str = "pending"  # ok | OOM | skipped | error
    reason: str = ""
    tokens_per_s: float | None = None
    step_seconds: float | None = None
    optim_seconds: float | None = None  # of step_seconds, the optimizer's step (Muon's Newton-Schulz costs matmuls)
    peak_bytes: int | None = None  # what the cap is compared with: CUDA reserved, or CPU RSS added by the cell
    peak_allocated: int | None = None  # CUDA only
    peak_reserved: int | None = None  # CUDA only
    peak_rss: int | None = None  # CPU only: the process's peak resident set during the cell
    estimate_bytes: int | None = None
    hours_for_target: float | None = None

    @property
    def label(self) -> str:
        return (f"{self.attn} s{self.seq_len} m{self.micro_batch}{f'x{self.accum}' if self.accum else ''}"
                f"{' ckpt' if self.grad_ckpt else ''}{' compile' if self.compile else ''}")


def parse_size(text: str) -> int:
    """'12GiB', '512MiB', '12GB', '1.5G', or bytes -> bytes (at least one)."""
    s = text.strip().replace(" ", "")
    units = {"kib": 1024, "mib": MiB, "gib": GiB, "kb": 1e3, "mb": 1e6, "gb": 1e9, "k": 1024, "m": MiB, "g": GiB,
             "b": 1}
    value: float | None = None
    for u in sorted(units, key=len, reverse=True):
        if s.lower().endswith(u):
            try:
                value = float(s[: -len(u)]) * units[u]
            except ValueError:
                pass
            break
    if value is None:
        try:
            value = int(s)
        except ValueError:
            raise BatonError(f"memory size {text!r} is not a size (examples: 12GiB, 512MiB, 8GB)") from None
    # A cap of nothing (or less, or beyond any machine) would record every cell as OOM: a typo, not a cap.
    if not math.isfinite(value) or value < 1:
        raise BatonError(f"memory size {text!r} must be a finite size of at least one byte (examples: 12GiB, 512MiB)")
    return int(value)


def flash_available(device: torch.device) -> bool:
    from .runtime.attention import device_refusal

    return device_refusal("flash_attention_2", device) is None


def estimate_bytes(cfg: Config, cell: Cell) -> int:
    """A rough upper estimate of a training step's memory: fp32 weights, gradients and Adam moments, plus
    the activations one micro-batch keeps for backward and its logits. Used only to refuse cells that
    cannot fit; measurements decide the rest."""
    m = cfg.model
    p = param_count(m)
    t = cell.micro_batch * cell.seq_len
    act = 2 if cfg.train.precision in ("bf16", "fp16") else 4
    per_layer = t * (10 * m.hidden + 4 * m.ffn) * act
    if cell.attn == "eager":
        per_layer += 2 * cell.micro_batch * m.n_heads * cell.seq_len * cell.seq_len * act  # scores + softmax
    layers = (t * m.hidden * act * m.n_layers + per_layer) if cell.grad_ckpt else per_layer * m.n_layers
    # The logits, their fp32 copy for the loss, and its gradient: of the whole micro-batch, or with a fused loss
    # head ("auto" counted unresolved: as unfused) of one chunk of rows at a time.
    fused = cfg.train.fused_ce is True or cfg.train.fused_ce in ("chunked", "liger")
    rows = min(t, chunk_rows(m.vocab_size)) if fused else t
    logits = 3 * rows * m.vocab_size * 4
    return int(16 * p + layers + logits)


class _RssSampler:
    """The process's peak resident set while running, sampled from /proc/self/statm."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def now(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def _trim() -> None:
    """Give freed memory back to the OS, so one cell's leftovers do not count against the next."""
    gc.collect()
    if torch.cuda.is_available():
        cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def precision_for(cfg: Config, device: torch.device) -> Precision:
    """The precision a training session on ``device`` runs under ``cfg`` (auto resolved as it would be)."""
    return resolve_precision(device) if cfg.train.precision == "auto" else cfg.train.precision


def run_cell(cfg: Config, cell: Cell, tokens_per_step: int, device: torch.device, warmup: int, steps: int,
             cap: int | None, target_tokens: int, ranks: int = 1) -> Cell:
    if tokens_per_step % (cell.micro_batch * cell.seq_len):
        cell.status = "skipped"
        cell.reason = f"{tokens_per_step} tokens/step is not a multiple of micro x seq_len"
        return cell
    cell.accum = tokens_per_step // (cell.micro_batch * cell.seq_len)
    if cell.attn == "flash_attention_2" and not flash_available(device):
        cell.status, cell.reason = "skipped", "flash-attn needs a CUDA GPU of sm80+ and the flash-attn package"
        return cell
    cell.estimate_bytes = estimate_bytes(cfg, cell)
    if cap is not None and cell.estimate_bytes > cap:
        cell.status = "OOM"
        cell.reason = f"estimated {_mib(cell.estimate_bytes)} MiB is over the cap of {_mib(cap)} MiB (not run)"
        return cell
    _trim()
    mcfg = dataclasses.replace(cfg.model, attn=cell.attn, grad_ckpt=cell.grad_ckpt,
                               max_seq_len=max(cfg.model.max_seq_len, cell.seq_len))
    on_gpu = device.type == "cuda"
    if on_gpu:
        cuda.reset_peak(device)
        if cap is not None:
            cuda.limit_memory(cap / cuda.total_memory(device), device)
    sampler = _RssSampler()
    base_rss = sampler.now()
    try:
        with sampler:
            seconds, optim_seconds = _time_steps(cfg, mcfg, cell, device, warmup, steps)
    except Exception as e:  # noqa: BLE001 - a cell's failure is a result, not the end of the grid
        if is_oom(e):
            cell.status, cell.reason = "OOM", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        else:
            cell.status, cell.reason = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            log.warning("bench cell %s failed: %s", cell.label, cell.reason)
        return cell
    finally:
        if on_gpu:
            cell.peak_allocated = cuda.peak_allocated(device)
            cell.peak_reserved = cuda.peak_reserved(device)
            cuda.limit_memory(1.0, device)
        _trim()
    cell.peak_rss = sampler.peak
    cell.peak_bytes = cell.peak_reserved if on_gpu else max(0, sampler.peak - base_rss)
    assert cell.peak_bytes is not None  # on CUDA the finally above has read peak_reserved
    cell.step_seconds = seconds / steps
    cell.optim_seconds = optim_seconds / steps
    cell.tokens_per_s = tokens_per_step * steps / seconds
    cell.hours_for_target = target_tokens / (cell.tokens_per_s * ranks) / 3600
    if cap is not None and cell.peak_bytes > cap:
        cell.status = "OOM"
        cell.reason = f"measured {_mib(cell.peak_bytes)} MiB is over the cap of {_mib(cap)} MiB"
    else:
        cell.status = "ok"
    return cell


def _time_steps(cfg: Config, mcfg, cell: Cell, device: torch.device, warmup: int, steps: int
                ) -> tuple[float, float]:
    """Seconds of ``steps`` whole steps, and of their optimizer steps alone."""
    model = build_model(mcfg, device, seed=cfg.train.seed)
    model.train()
    opt = build_optimizer(model, cfg, device)  # the run's optimizer: AdamW, or Muon and AdamW
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
    if cell.compile:
        # Compiled afresh, as a session compiles: graphs left by the cells before would be reused with dynamic
        # shapes (dynamo's answer to a second shape), and past its recompile limit a cell ran eagerly.
        torch._dynamo.reset()
    # The session's own micro-loss: its fused head and cross-entropy, its compile scope, its fallback to eager.
    micro_loss = micro_loss_fn(dtype, compiled=cell.compile, fused=cfg.train.fused_ce,
                               scope=cfg.train.compile_scope)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.precision == "fp16")
    g = torch.Generator().manual_seed(cfg.train.seed)
    ids = torch.randint(0, cfg.model.vocab_size, (cell.micro_batch, cell.seq_len + 1), generator=g).to(device)
    x, y = ids[:, :-1], ids[:, 1:]

    on_gpu = device.type == "cuda"
    # CUDA events around the optimizer step time it without a synchronisation inside the step.
    marks: list[tuple[Any, Any]] = []

    def step(timed: bool = False) -> None:
        for _ in range(cell.accum):
            scaler.scale(micro_loss(model, x, y) / cell.accum).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
        if timed:
            marks.append((_mark(on_gpu), None))
        scaler.step(opt)
        if timed:
            marks[-1] = (marks[-1][0], _mark(on_gpu))
        scaler.update()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            cuda.synchronize(device)

    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(timed=True)
    sync()
    seconds = time.perf_counter() - t0
    optim = sum(a.elapsed_time(b) / 1000 for a, b in marks) if on_gpu else sum(b - a for a, b in marks)
    if fallbacks(micro_loss):
        cell.reason = "; ".join(fallbacks(micro_loss))  # timed, but not compiled: said beside the numbers
    return seconds, optim


def _mark(on_gpu: bool) -> Any:
    """A point in time: a recorded CUDA event (read after the final synchronisation), else the clock."""
    if not on_gpu:
        return time.perf_counter()
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def run_grid(cfg: Config, attns: list[Attn], seqs: list[int], micros: list[int], ckpts: list[bool],
             compiles: list[bool], tokens_per_step: int, device: torch.device, warmup: int = 2, steps: int = 5,
             cap: int | None = None, target_tokens: int = 0, ranks: int = 1, progress=None) -> list[Cell]:
    cells = [Cell(a, s, m, c, k) for a in attns for s in seqs for m in micros for c in ckpts for k in compiles]
    cfg = copy.deepcopy(cfg)
    if cfg.train.precision == "auto":  # timed as training runs it (bf16 or fp16 on a GPU), not as fp32
        cfg.train.precision = precision_for(cfg, device)
    # The loss head as training runs it (auto: chunked on CUDA), resolved by the same rule.
    t = cfg.train
    t.fused_ce, _ = fused_ce.decide(t.fused_ce, device.type, t.fused_ce == "liger" and fused_ce.installed(), t.parallel)
    fused_ce.refuse_liger_fp16(t.fused_ce, t.precision)
    if t.compile_scope == "blocks" and not regional.supported():
        t.compile_scope = "model"  # as the session does: this torch would compile every layer anew
    if cfg.train.threads:  # the threads `baton train` would use: the rate is the run's, whichever command measures it
        torch.set_num_threads(cfg.train.threads)
    if device.type == "cpu" and cells:
        # The process's first build and step grow its heap once (allocator arenas, kernels' buffers, imports done
        # lazily): measured as RSS added, that charged the grid's first cell alone, so the cap's verdict depended
        # on the grid's order. One untimed cell first, thrown away.
        first = cells[0]
        run_cell(cfg, Cell(first.attn, first.seq_len, first.micro_batch, first.grad_ckpt, False),
                 tokens_per_step, device, 1, 1, None, target_tokens, ranks)
    for cell in cells:
        run_cell(cfg, cell, tokens_per_step, device, warmup, steps, cap, target_tokens, ranks)
        if progress:
            progress(cell)
    return cells


# -------------------------------------------------------------------------------------- choosing


def pick(cells: list[Cell], cap: int | None = None, allow_compile: bool = False) -> Cell | None:
    """The fastest cell that ran, fits the cap, and `baton train` can reproduce."""
    ok = [c for c in cells if c.status == "ok" and (cap is None or (c.peak_bytes or 0) <= cap)
          and (allow_compile or not c.compile)]
    return max(ok, key=lambda c: c.tokens_per_s or 0.0) if ok else None


def overrides(cell: Cell, cfg: Config, tokens_per_step: int | None = None, ranks: int = 1) -> list[str]:
    """The ``--set`` overrides that make ``cfg`` train as ``cell`` was measured: its attention, checkpointing,
    micro-batch and sequence length, at the bench's tokens per step (per rank) x ``ranks``."""
    tps = (tokens_per_step or cfg.tokens_per_step // ranks) * ranks
    if tps % cell.seq_len:
        raise BatonError(f"seq_len {cell.seq_len} does not divide {tps:,} tokens per step")
    global_batch = tps // cell.seq_len
    if global_batch % (cell.micro_batch * ranks):
        raise BatonError(f"a global batch of {global_batch} samples is not a multiple of micro-batch "
                         f"{cell.micro_batch} x {ranks} rank(s)")
    out = [f"model.attn={cell.attn}", f"model.grad_ckpt={'true' if cell.grad_ckpt else 'false'}",
           f"train.micro_batch={cell.micro_batch}"]
    if cell.seq_len != cfg.data.seq_len:
        out.append(f"data.seq_len={cell.seq_len}")
        if cell.seq_len > cfg.model.max_seq_len:
            out.append(f"model.max_seq_len={cell.seq_len}")
    if global_batch != cfg.train.global_batch:
        out.append(f"train.global_batch={global_batch}")
    # Pinned both ways: train.compile = auto turns it on on a CUDA GPU, and an uncompiled cell is not that step.
    out.append(f"train.compile={'true' if cell.compile else 'false'}")
    return out


# -------------------------------------------------------------------------------------- writing


def _mib(v: float | None) -> str:
    """MiB to a tenth, with three digits below a tenth: a 1 KiB cap is not "0.0 MiB"."""
    return "—" if v is None else f"{v / MiB:,.1f}" if abs(v) >= MiB / 10 else f"{v / MiB:.3g}"


def _hours(h: float | None) -> str:
    return "—" if h is None else f"{h:,.1f}" if h >= 10 else f"{h:.3g}"


def table(cells: list[Cell], device: torch.device) -> str:
    on_gpu = device.type == "cuda"
    mem = "| peak alloc MiB | peak reserved MiB |" if on_gpu else "| RSS added MiB | peak RSS MiB |"
    lines = ["| attn | seq | micro x accum | grad ckpt | compile | tokens/s | step s | optimizer s " + mem +
             " est. MiB | h for target | status |",
             "|---|---|---|---|---|---|---|---" + "|---" * 3 + "|---|---|"]
    for c in cells:
        m1, m2 = (c.peak_allocated, c.peak_reserved) if on_gpu else (c.peak_bytes, c.peak_rss)
        status = c.status if not c.reason else f"{c.status}: {c.reason}"
        lines.append(
            f"| {c.attn} | {c.seq_len} | {c.micro_batch} x {c.accum or '—'} | {'on' if c.grad_ckpt else 'off'} | "
            f"{'on' if c.compile else 'off'} | {'—' if c.tokens_per_s is None else f'{c.tokens_per_s:,.0f}'} | "
            f"{'—' if c.step_seconds is None else f'{c.step_seconds:.3f}'} | "
            f"{'—' if c.optim_seconds is None else f'{c.optim_seconds:.4f}'} | {_mib(m1)} | {_mib(m2)} | "
            f"{_mib(c.estimate_bytes)} | {_hours(c.hours_for_target)} | "
            f"{status} |")
    return "\n".join(lines)


def plot(cells: list[Cell], path: Path, cap: int | None, device: torch.device) -> None:
    plt = extras.pyplot("the bench plot")

    labels = [c.label for c in cells]
    rates = [c.tokens_per_s or 0.0 for c in cells]
    mems = [(c.peak_bytes or 0) / MiB for c in cells]
    colors = ["tab:blue" if c.status == "ok" else "tab:red" if c.status == "OOM" else "tab:gray" for c in cells]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 0.45 * len(cells) + 1.8), sharey=True)
    y = range(len(cells))
    a1.barh(y, rates, color=colors)
    a1.set_yticks(list(y), labels, fontsize=8)
    a1.set_xlabel("tokens/s")
    for i, c in enumerate(cells):
        if c.status != "ok":
            a1.text(0, i, f" {c.status}", va="center", fontsize=8, color=colors[i])
    a2.barh(y, mems, color=colors)
    a2.set_xlabel("peak reserved MiB" if device.type == "cuda" else "RSS added by the cell, MiB")
    if cap is not None:
        a2.axvline(cap / MiB, color="tab:red", linestyle="--", label="cap")
        a2.legend(fontsize=8)
    a1.invert_yaxis()
    fig.suptitle("baton bench (red: OOM or over the cap; gray: skipped or failed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(cells: list[Cell], out: Path, meta: dict[str, Any], cap: int | None,
                  device: torch.device) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "bench.md", "json": out / "bench.json"}
    md = [f"# baton bench: {meta['device']}", "",
          f"{meta['tokens_per_step']:,} tokens per step per rank, {meta['warmup']} warm-up + {meta['steps']} timed "
          f"steps per cell, precision {meta['precision']}, optimizer {meta.get('optimizer', 'adamw')}, "
          f"{meta['params']:,} parameters; hours for "
          f"{meta['target_tokens']:,} tokens over {meta['ranks']} rank(s)."
          + (f" Memory cap {cap / MiB:,.0f} MiB." if cap else ""), "", table(cells, device), ""]
    paths["md"].write_text("\n".join(md), encoding="utf-8")
    paths["json"].write_text(json.dumps({**meta, "cap_bytes": cap,
                                         "cells": [dataclasses.asdict(c) | {"label": c.label} for c in cells]},
                                        indent=1), encoding="utf-8")
    if extras.available("matplotlib"):
        paths["png"] = out / "bench.png"
        plot(cells, paths["png"], cap, device)
    else:
        extras.skip_note("matplotlib", "bench.png")
    return paths


def rate_from_json(path: Path) -> tuple[float, str]:
    """The rate `baton plan` should use from a bench.json: its picked cell, else its fastest cell, x ranks."""
    from .reads import reading

    with reading(path, "bench file", "give the bench.json that `baton bench` wrote, or rerun `baton bench`",
                 also=(KeyError, TypeError, AttributeError)):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cells = [Cell(**{k: v for k, v in c.items() if k in Cell.__dataclass_fields__}) for c in data["cells"]]
        chosen = None
        if data.get("picked"):
            chosen = next((c for c in cells if c.label == data["picked"]), None)
        chosen = chosen or pick(cells, data.get("cap_bytes"), allow_compile=True)
        ranks = int(data.get("ranks", 1))
        rate = float(chosen.tokens_per_s) * ranks if chosen is not None and chosen.tokens_per_s else 0.0
    if not rate > 0 or not math.isfinite(rate):
        raise BatonError(f"{path} has no cell that ran within its cap; nothing to plan with")
    assert chosen is not None  # a rate above 0 comes only from a chosen cell
    return rate, f"{path}: {chosen.label} x {ranks} rank(s)"
