"""FSDP + fp16 on two ranks: an overflow in one rank's gradient shard must skip the step on every rank.

Run under torchrun with 2 processes: ``python -m torch.distributed.run --standalone --nproc-per-node 2
benchmarks/fsdp_fp16_ranks.py OUT_DIR [cpu|cuda]``. On CPU the ranks meet over gloo (the test suite:
tests/dist/test_dist_fsdp_fp16.py); on CUDA over NCCL, rank r on GPU ``r mod visible GPUs``
(benchmarks/gpu_check.py's fsdp_fp16 case).

Two steps of a small Llama sharded by baton's own ``Parallel("fsdp")``, with fp16 autocast and a GradScaler,
in the order ``baton.loop.train_step`` runs them (scale, backward, unscale, clip, step, update). In the first
step rank 1 alone writes an inf into its own shard of one gradient; the second step is clean. Each rank
writes what it saw to ``OUT_DIR/rank-<r>.json`` (or, where NCCL refuses two ranks on one GPU, why).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from baton.config import Config, ModelConfig  # noqa: E402
from baton.model.llama import build_model  # noqa: E402
from baton.model.optimizer import adamw  # noqa: E402
from baton.runtime.parallel import Parallel, norm_value  # noqa: E402


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def steps(device: torch.device, rank: int, world: int) -> list[dict]:
    cfg = Config()
    cfg.model = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn=64, vocab_size=128, max_seq_len=16)
    model = build_model(cfg.model, device, seed=0)
    model, opt = Parallel("fsdp", rank, world, device).wrap(model, adamw(model, cfg, device),
                                                           lambda m: adamw(m, cfg, device))
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    torch.manual_seed(1 + rank)
    record = []
    for step in range(2):
        x = torch.randint(0, 128, (2, 9), device=device)
        with torch.autocast(device.type, dtype=torch.float16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 128), x[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        if step == 0 and rank == 1:
            # The overflow lands in this rank's shard only: rank 0's own gradients are all finite.
            grad = local(model.model.layers[0].mlp.down_proj.weight.grad)
            grad.view(-1)[0] = math.inf
        own_finite = all(bool(torch.isfinite(local(p.grad)).all()) for p in model.parameters() if p.grad is not None)
        before = [local(p).detach().clone() for p in model.parameters()]
        scale = scaler.get_scale()
        scaler.unscale_(opt)
        grad_norm = norm_value(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        unchanged = all(torch.equal(b, local(p).detach()) for b, p in zip(before, model.parameters()))
        record.append({"step": step, "own_grads_finite": own_finite, "grad_norm_finite": math.isfinite(grad_norm),
                       "scale_before": scale, "scale_after": scaler.get_scale(), "weights_unchanged": unchanged})
    return record


def main(out: Path, kind: str) -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if kind == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result: dict | list = steps(device, rank, world)
    except Exception as e:  # noqa: BLE001 - NCCL's own refusal of two ranks on one GPU is a result, not a crash
        if "Duplicate GPU" not in str(e):
            raise
        result = {"refused": "NCCL refuses two ranks on one GPU (Duplicate GPU detected): needs 2 GPUs"}
    (out / f"rank-{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    if isinstance(result, list):
        dist.destroy_process_group()
    else:
        # After NCCL's refusal the communicator is broken: tearing it down (here or at interpreter exit) can
        # wait forever on the other rank, so the process leaves at once, its result already on disk.
        os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cpu")
