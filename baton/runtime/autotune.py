"""Speed settings, resolved once at session start into concrete values in the session's config:
precision, ``torch.compile``, the fused cross-entropy and the micro-batch. Plus the one function a micro-step runs.

The resolved values replace ``auto`` in the config that every checkpoint and run summary saves, so a run
records what it actually did. None of them is a frozen key: a run resumed on other hardware may resolve
them differently (a different micro-batch changes the accumulation, not the samples of a step).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from ..config import Config, Precision
from ..errors import ConfigError
from . import attention, cuda, fused_ce, memory, regional
from .compiled import CompiledOrEager

log = logging.getLogger(__name__)

# Without GPU memory to probe, micro_batch = "auto" takes the largest candidate up to this (the default).
CPU_AUTO_MICRO_BATCH = 4
# A micro-batch fits when the probe's peak reserved memory stays under this share of the GPU, leaving room
# for allocator fragmentation and for what the probe does not run (DDP buckets, the optimizer's temporaries).
GPU_MEMORY_SHARE = 0.90

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve(cfg: Config, device: torch.device, world: int) -> dict[str, Any]:
    """Replace every ``auto`` in ``cfg.train`` by a concrete value; returns what was decided and why."""
    t = cfg.train
    notes: dict[str, Any] = {}
    if t.precision == "auto":
        t.precision = resolve_precision(device)
        notes["precision"] = f"auto -> {t.precision}"
    elif t.precision == "bf16" and device.type == "cuda" and not _bf16_native(device):
        # Emulated there: several times slower than fp16, SDPA falls back to its math kernel and compile
        # skips the graphs. A run that says bf16 on such a GPU is a mistake worth a stop, not a warning.
        cap = cuda.capability(device)
        raise ConfigError(f"train.precision=bf16 needs a GPU with bf16 tensor cores (compute capability 8.0 or newer), "
                          f"and {cuda.name(device)} is {cap[0]}.{cap[1]} (set train.precision = "
                          "\"fp16\", or \"auto\", which picks fp16 there)")
    setting = cfg.model.attn
    attn, how = attention.resolve(cfg, device, AUTOCAST.get(t.precision))
    if how is not None and world > 1:
        from . import dist

        # A choice timed on each rank may differ between them (two kernels a tenth of a millisecond apart): every
        # rank trains with rank 0's, the one recorded (and in the compile cache's key).
        attn, how = dist.broadcast((attn, how))
    if how is not None:
        cfg.model.attn = attn
        notes["attn"] = how
    order = attention.sdpa_priority(setting, device.type, cuda.capability(device) if device.type == "cuda" else None,
                                    t.deterministic, attention.priority_settable())
    if order and attn == "sdpa":
        # Before the micro-batch probe: it measures the memory of the kernels the run will use.
        attention.ORDER.enter(order)
        notes["attn"] = f"{how}; SDPA kernels in order {', '.join(order)}"
        notes["sdpa_priority"] = list(order)
    if t.compile == "auto":
        # On by default where it pays: on CUDA (measured in benchmarks/gpu_check.py) from compute capability
        # 7.0, the oldest Triton generates kernels for (a P100 cannot compile); on CPU the minutes of code
        # generation buy little for the small models trained there.
        t.compile = device.type == "cuda" and cuda.capability(device) >= (7, 0)
        notes["compile"] = f"auto -> {t.compile}"
    if t.compile and t.compile_scope == "blocks" and not regional.supported():
        t.compile_scope = "model"
        notes["compile_scope"] = (f"blocks -> model (torch {torch.__version__.split('+')[0]} would compile every "
                                  "layer anew; torch 2.5 and newer share one compiled block)")
    # Before the micro-batch: the probe measures the loss the run will use, and the logits dominate memory.
    # After the precision: liger under fp16 is refused (see fused_ce), also when auto chose fp16.
    fused, why = fused_ce.decide(t.fused_ce, device.type, t.fused_ce == "liger" and fused_ce.installed(), t.parallel)
    fused_ce.refuse_liger_fp16(fused, t.precision)
    if t.fused_ce == "auto":
        notes["fused_ce"] = f"auto -> {fused} ({why})"
    t.fused_ce = fused
    if t.micro_batch == "auto":
        per_rank = t.global_batch // world
        if per_rank < 1 or t.global_batch % world:  # a world given without the launcher's check (torchrun itself)
            raise ConfigError(f"train.global_batch={t.global_batch} does not split over {world} ranks: make it a "
                              f"multiple of {world}, or change the ranks")
        t.micro_batch, probe = auto_micro_batch(cfg, device, per_rank)
        if device.type == "cuda":
            notes["micro_batch_probe"] = probe
            if world > 1:
                from . import dist

                # Every rank must accumulate the same number of micro-batches: the smallest fit wins.
                t.micro_batch = int(-dist.maximum(-float(t.micro_batch), device))
        else:
            log.info("micro_batch auto probes GPU memory; on %s it uses %d (set train.micro_batch to choose)",
                     device.type, t.micro_batch)
        notes["micro_batch"] = f"auto -> {t.micro_batch} (accumulation {per_rank // t.micro_batch})"
    for k, v in notes.items():
        if isinstance(v, str):
            log.info("%s.%s: %s", "model" if k == "attn" else "train", k, v)
    return notes


def resolve_precision(device: torch.device) -> Precision:
    """auto: bf16 where the GPU has bf16 tensor cores (Ampere and newer), else fp16 with a GradScaler;
    fp32 on CPU (autocast there costs more than it saves for these models).

    fp16 holds under FSDP too: the GradScaler's overflow check runs on the gradient shards as DTensors,
    which all-reduce the found-inf flag, so an overflow on one rank's shard skips the step on every rank
    (tests/dist/test_dist_fsdp_fp16.py)."""
    if device.type != "cuda":
        return "fp32"
    return "bf16" if _bf16_native(device) else "fp16"


def _bf16_native(device: torch.device) -> bool:
    return cuda.capability(device)[0] >= 8


def micro_batch_candidates(per_rank: int) -> list[int]:
    """Micro-batches that divide this rank's share of the global batch: powers of two, and the share itself
    (no accumulation), ascending. The global batch, and so the tokens per step, never change."""
    cands = {per_rank}
    p = 1
    while p < per_rank:
        if per_rank % p == 0:
            cands.add(p)
        p *= 2
    return sorted(cands)


def auto_micro_batch(cfg: Config, device: torch.device, per_rank: int) -> tuple[int, list[dict[str, Any]]]:
    """What ``micro_batch = "auto"`` becomes for a rank's share of ``per_rank`` samples on ``device``: the
    memory probe's pick on CUDA (with its trials), elsewhere the largest candidate up to CPU_AUTO_MICRO_BATCH."""
    if device.type == "cuda":
        return probe_micro_batch(cfg, device, per_rank)
    return max(c for c in micro_batch_candidates(per_rank) if c <= CPU_AUTO_MICRO_BATCH), []


def probe_micro_batch(cfg: Config, device: torch.device, per_rank: int) -> tuple[int, list[dict[str, Any]]]:
    """The largest candidate micro-batch whose real forward + backward at ``data.seq_len`` fits in memory.

    The probe runs on a throwaway replica of the model (the session builds its own afterwards, so neither
    the weights nor the RNG streams of the run are touched) with the memory of AdamW's two moments held
    aside, since those only appear at the first optimizer step. Candidates go up from 1 and the probe stops
    at the first that does not fit.
    """
    from ..model.llama import build_model, count_parameters

    total = cuda.total_memory(device)
    model = build_model(cfg.model, device)
    n = count_parameters(model)
    # AdamW's moments (2 x fp32); with several ranks, DDP's gradient buckets are about one more copy.
    extra = 3 if torch.distributed.is_initialized() else 2
    reserve = torch.empty(extra * n, dtype=torch.float32, device=device)
    precision = resolve_precision(device) if cfg.train.precision == "auto" else cfg.train.precision  # as it trains
    loss_fn = micro_loss_fn(AUTOCAST.get(precision), compiled=False, fused=cfg.train.fused_ce)
    try:
        chosen, tried = choose_micro_batch(
            micro_batch_candidates(per_rank),
            lambda mb: _try_micro_batch(model, loss_fn, mb, cfg.data.seq_len, device, total))
    finally:
        del reserve
        model = None  # the probe's memory goes back before the session builds its model
        gc.collect()
        cuda.empty_cache()
        cuda.reset_peak(device)
    if chosen is None:
        raise ConfigError(
            f"micro_batch auto: not even 1 sample of {cfg.data.seq_len} tokens fits in "
            f"{total / 2**30:.1f} GiB on {cuda.name(device)} (turn on model.grad_ckpt, lower "
            "data.seq_len, or use a smaller model)"
        )
    log.info("micro_batch auto: %s", ", ".join(
        f"{t['micro_batch']} {'fits' if t['fits'] else 'does not fit'} ({t['peak_reserved_bytes'] / 2**30:.1f} GiB)"
        for t in tried))
    return chosen, tried


def choose_micro_batch(candidates: list[int], attempt: Callable[[int], tuple[bool, int]]
                       ) -> tuple[int | None, list[dict[str, Any]]]:
    """Walk up the ascending candidates while ``attempt(mb)`` says (fits, peak bytes) fits; the last that
    fitted wins (None when even the first does not). Memory grows with the micro-batch, so the first
    failure ends the search: nothing larger is tried, and at most one attempt runs out of memory."""
    chosen, tried = None, []
    for mb in candidates:
        fits, peak = attempt(mb)
        tried.append({"micro_batch": mb, "fits": fits, "peak_reserved_bytes": peak})
        if not fits:
            break
        chosen = mb
    return chosen, tried


def _try_micro_batch(model, loss_fn, mb: int, seq_len: int, device, total: int) -> tuple[bool, int]:
    cuda.empty_cache()
    cuda.reset_peak(device)
    x = torch.zeros((mb, seq_len + 1), dtype=torch.long, device=device)
    try:
        loss_fn(model, x[:, :-1], x[:, 1:]).backward()
        cuda.synchronize(device)
        peak = cuda.peak_reserved(device)
        return peak <= GPU_MEMORY_SHARE * total, peak
    except (torch.OutOfMemoryError, RuntimeError) as e:
        # cuBLAS's workspace, cuDNN or a Triton kernel's own allocation fail as a RuntimeError, not the
        # allocator's OutOfMemoryError; any of them means this micro-batch does not fit. Other errors rise.
        if not memory.is_oom(e):
            raise
        return False, cuda.peak_reserved(device)
    finally:
        model.zero_grad(set_to_none=True)
        del x


def micro_loss_fn(autocast_dtype: torch.dtype | None, compiled: bool, backend: str | Callable | None = None,
                  fused: bool | str = False, scope: str = "model") -> Callable:
    """``loss(model, x, y)`` of one micro-batch: forward under autocast, cross-entropy in fp32.

    Compiled, the graph spans the model and the loss, so the fp32 upcast of the logits and the
    cross-entropy fuse instead of materialising a second copy of the logits. ``scope="blocks"``: the decoder
    block is compiled once and shared by every layer, and the loss on its own (baton.runtime.regional).
    ``fused`` ("chunked", "liger"; true is "chunked"): the head and the cross-entropy computed a chunk of rows
    at a time instead (baton.runtime.fused_ce), so the logits of the whole micro-batch never exist; chunked is
    compiled with the model (or, by blocks, on its own beside the compiled blocks), liger's kernel runs beside
    the compiled body. Either way a compilation that fails falls back to eager for the session
    (baton.runtime.compiled), never ends it.
    """
    if compiled and scope == "blocks":
        return _blocks_loss_fn(autocast_dtype, backend, fused)
    if fused:
        return fused_ce.micro_loss_fn("chunked" if fused is True else fused,  # type: ignore[arg-type]
                                      autocast_dtype, compiled, backend)

    def micro_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
        with ctx:
            logits = model(input_ids=x).logits
        return _cross_entropy(logits, y)

    return CompiledOrEager(micro_loss, "the forward and loss", backend) if compiled else micro_loss


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if logits.dtype != torch.float32:  # (fp32 already on CPU: .float() would still cost a dispatch)
        logits = logits.float()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def _blocks_loss_fn(autocast_dtype: torch.dtype | None, backend: str | Callable | None,
                    fused: bool | str) -> Callable:
    """The micro-loss with the decoder block compiled once for every layer (and, unfused, the loss compiled on its
    own, where the fp32 upcast of the logits fuses into the cross-entropy)."""
    parts: list[Any] = []
    blocks = regional.CompiledBlocks(backend, parts)
    if fused:
        def body(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            blocks.install(model)
            return fused_ce.head_inputs(model, x)

        fn = fused_ce.micro_loss_fn("chunked" if fused is True else fused,  # type: ignore[arg-type]
                                    autocast_dtype, True, backend, body=body)
        parts.extend(getattr(fn, "compiled_parts", []))
        fn.compiled_parts = parts  # type: ignore[attr-defined]
        return fn
    loss = CompiledOrEager(_cross_entropy, "the loss", backend)
    parts.append(loss)

    def micro_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        blocks.install(model)
        ctx = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
        with ctx:
            logits = model(input_ids=x).logits
        return loss(logits, y)

    micro_loss.compiled_parts = parts  # type: ignore[attr-defined]
    return micro_loss
