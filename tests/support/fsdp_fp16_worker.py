"""One rank of the FSDP + fp16 overflow check (tests/dist/test_dist_fsdp_fp16.py), run under torchrun on gloo.

Two steps of a small Llama sharded by baton's own ``Parallel("fsdp")``, with fp16 autocast and a GradScaler,
in the order ``baton.loop.train_step`` runs them (scale, backward, unscale, clip, step, update). In the first
step rank 1 alone writes an inf into its own shard of one gradient; the second step is clean. Each rank
writes what it saw to ``<out>/rank-<r>.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from baton.config import Config, ModelConfig
from baton.model.llama import build_model
from baton.model.optimizer import adamw
from baton.runtime.parallel import Parallel, norm_value


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = Config()
    cfg.model = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn=64, vocab_size=128, max_seq_len=16)
    device = torch.device("cpu")
    model = build_model(cfg.model, device, seed=0)
    model, opt = Parallel("fsdp", rank, world, device).wrap(model, adamw(model, cfg, device),
                                                           lambda m: adamw(m, cfg, device))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    torch.manual_seed(1 + rank)
    record = []
    for step in range(2):
        x = torch.randint(0, 128, (2, 9))
        with torch.autocast("cpu", dtype=torch.float16):
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
    (out / f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
