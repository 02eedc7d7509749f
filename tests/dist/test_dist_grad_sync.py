"""Gradient synchronisation happens once per optimizer step, on the last micro-batch: counted, not inferred.

Skipping the sync on earlier micro-batches cannot change the numbers (averaging then summing equals
summing then averaging), so the multi-process runs cannot see it; a communication hook that counts the
all-reduces can. One gloo process group of one rank, in this process.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as tdist

from baton.runtime.parallel import Parallel


@pytest.fixture
def group(tmp_path):
    # A file rendezvous: no port to pick, so none another process can take first.
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1,
                             timeout=datetime.timedelta(seconds=30))
    yield
    tdist.destroy_process_group()


def test_ddp_all_reduces_only_on_the_last_micro_batch(group):
    par = Parallel("ddp", rank=0, world=2, device=torch.device("cpu"))  # world>1: the DDP path, as on 2 ranks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters())
    model, opt = par.wrap(model, opt, lambda m: torch.optim.AdamW(m.parameters()))
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, counting_hook)
    accum = 3
    for step in range(2):
        before = len(calls)
        for j in range(accum):
            with par.grad_sync(model, enabled=j == accum - 1):
                model(torch.randn(4, 8)).sum().backward()
            if j < accum - 1:
                assert len(calls) == before, f"step {step}: gradients synced on micro-batch {j}"
        assert len(calls) > before, f"step {step}: no sync on the last micro-batch"
        opt.step()
        opt.zero_grad(set_to_none=True)
