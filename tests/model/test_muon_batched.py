"""baton's Muon (baton/model/muon.py) batches the Newton-Schulz iterations of same-shaped matrices; everything else
is torch.optim.Muon. Against it, step after step, for every learning-rate adjustment, with and without Nesterov,
tall, wide and square matrices in one group and in several groups: the momentum buffers are bit-identical, and
the weights agree within bfloat16's rounding of the orthogonalised update. A batched matrix product may sum in
another order than a single one, so an entry of the update (magnitude below 2, bfloat16 like torch's) can end
one rounding step apart, 2**-7 at most; over ``k`` steps a weight then lies within ``k x lr' x 2**-6`` (``lr'``:
the adjusted learning rate, with room for the rounding's carry through the iterations), and nearly every entry is
equal. Their state dicts load into each other."""

from __future__ import annotations

import copy

import pytest
import torch

from baton.model.muon import Muon, orthogonalised

# The reference model's block shapes, scaled down by 12: q, k, v, o, gate, up, down.
SHAPES = [(48, 48), (16, 48), (16, 48), (48, 48), (128, 48), (128, 48), (48, 128)]


def params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(0.02 * torch.randn(s, generator=g)) for s in SHAPES * 3]


def step_both(a, b, pa, pb, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for x, y in zip(pa, pb):
            grad = torch.randn(x.shape, generator=g)
            x.grad, y.grad = grad.clone(), grad.clone()
        a.step()
        b.step()


def assert_within_rounding(pa, pb, steps: int, lr: float, adjust) -> None:
    from baton.model.muon import lr_ratio

    same = total = 0
    for x, y in zip(pa, pb):
        bound, apart = steps * lr * lr_ratio(adjust, *x.shape) * 2**-6, float((x - y).detach().abs().max())
        assert apart <= bound, (x.shape, apart, bound)
        same, total = same + int((x == y).sum()), total + x.numel()
    assert same >= 0.99 * total


@pytest.mark.parametrize("adjust", [None, "original", "match_rms_adamw", "spectral_unclamped"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_as_torchs_muon_within_rounding(adjust, nesterov):
    pa, pb = params(), params()
    kw = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9, "nesterov": nesterov, "adjust_lr_fn": adjust}
    ours, theirs = Muon(pa, **kw), torch.optim.Muon(pb, **kw)
    step_both(ours, theirs, pa, pb, steps=4)
    assert_within_rounding(pa, pb, 4, 0.02, adjust)
    for x, y in zip(pa, pb):
        assert torch.equal(ours.state[x]["momentum_buffer"], theirs.state[y]["momentum_buffer"])


def test_groups_of_their_own_and_state_dicts_that_move_between_the_two():
    pa, pb = params(), params()
    groups = lambda ps: [{"params": ps[:7], "lr": 0.02}, {"params": ps[7:], "lr": 0.01, "ns_steps": 3}]  # noqa: E731
    ours, theirs = Muon(groups(pa), weight_decay=0.0), torch.optim.Muon(groups(pb), weight_decay=0.0)
    step_both(ours, theirs, pa, pb, steps=2)
    # Each continues from the other's state: still in step.
    mine = copy.deepcopy(ours.state_dict())  # (a loaded state holds the very tensors given: copies, not shared)
    ours.load_state_dict(copy.deepcopy(theirs.state_dict()))
    theirs.load_state_dict(mine)
    step_both(ours, theirs, pa, pb, steps=2, seed=2)
    assert_within_rounding(pa, pb, 4, 0.02, None)


def test_one_stack_per_shape_as_newton_schulz_sees_it():
    """A tall matrix is iterated as its transpose: gate, up (128 x 48) and down (48 x 128) are one stack."""
    seen = []
    real = torch.stack

    def stack(tensors, *a, **k):
        seen.append(tuple(tensors[0].shape) + (len(tensors),))
        return real(tensors, *a, **k)

    g = torch.Generator().manual_seed(0)
    updates = [torch.randn(s, generator=g) for s in SHAPES]
    torch.stack = stack
    try:
        out = orthogonalised(updates, (3.4445, -4.7750, 2.0315), 5, 1e-7)
    finally:
        torch.stack = real
    assert sorted(seen) == [(16, 48, 2), (48, 48, 2), (48, 128, 3)]
    assert [o.shape for o in out] == [u.shape for u in updates] and all(o.dtype == torch.bfloat16 for o in out)
