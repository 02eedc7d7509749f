"""The chunked linear cross-entropy (baton/runtime/chunked_ce.py, train.fused_ce = "chunked"): the same loss and
gradients as the unfused head, without keeping the logits of the whole micro-batch, fp16-safe, and the same
compiled as eager.

Tolerances (fp32): the loss within 2e-6 relative and every gradient within 1e-6 absolute of the unfused loss's.
The chunked loss sums its rows in another order (per chunk, then the chunks), so the last bits may differ; the
gradients of these sizes are of order 1e-2, so 1e-6 is a few units in their last place.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from baton.config import ModelConfig
from baton.model.llama import build_model
from baton.runtime import chunked_ce
from baton.runtime.autotune import micro_loss_fn
from baton.runtime.chunked_ce import IGNORE_INDEX, chunk_rows, linear_cross_entropy

LOSS_RTOL, GRAD_ATOL = 2e-6, 1e-6


def inputs(tokens=50, hidden=16, vocab=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).requires_grad_()
    w = torch.randn(vocab, hidden, generator=g).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g)
    y[3] = y[17] = IGNORE_INDEX  # padding: neither in the loss nor in the count it is averaged over
    return h, w, y


def loss_and_grads(fn, h, w, y, scale=1.0):
    h.grad = w.grad = None
    loss = fn(h, w, y)
    (loss * scale).backward()
    return loss.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("rows", [1, 7, 16, 50, 64])  # one row, a tail chunk, even chunks, one chunk, more than all
@pytest.mark.parametrize("grad_in_forward", [True, False])
def test_the_same_loss_and_gradients_as_the_unfused_head(rows, grad_in_forward):
    h, w, y = inputs()
    ref = loss_and_grads(lambda h, w, y: F.cross_entropy(F.linear(h, w).float(), y), h, w, y, scale=3.0)
    got = loss_and_grads(lambda h, w, y: linear_cross_entropy(h, w, y, rows=rows, grad_in_forward=grad_in_forward),
                         h, w, y, scale=3.0)  # the loss's own gradient (1/accum, a GradScaler's scale) applies
    assert got[0].dtype == torch.float32
    assert torch.allclose(got[0], ref[0], rtol=LOSS_RTOL, atol=0)
    for a, b in zip(got[1:], ref[1:]):
        assert torch.allclose(a, b, rtol=0, atol=GRAD_ATOL)
    assert int((got[1][[3, 17]] != 0).sum()) == 0  # an ignored row gets no gradient


def test_without_a_gradient_it_computes_the_loss_alone():
    h, w, y = inputs()
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, y, rows=8)
    assert torch.allclose(loss, F.cross_entropy(F.linear(h, w), y), rtol=LOSS_RTOL, atol=0)


@pytest.mark.parametrize("grad_in_forward", [True, False])
def test_what_stays_for_the_backward_pass_is_never_tokens_by_vocabulary(grad_in_forward):
    tokens, hidden, vocab = 256, 16, 1000
    h, w, y = inputs(tokens, hidden, vocab)

    def saved_sizes(fn) -> list[int]:
        sizes: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            assert fn().grad_fn is not None
        return sizes

    plain = saved_sizes(lambda: F.cross_entropy(F.linear(h, w).float(), y))
    chunked = saved_sizes(lambda: linear_cross_entropy(h, w, y, rows=32, grad_in_forward=grad_in_forward))
    assert max(plain) >= tokens * vocab  # the unfused head keeps every logit for its backward
    # The chunked loss keeps the hidden states or their gradient (tokens x hidden), the head or its gradient
    # (vocab x hidden), the targets and one log-sum-exp per token: nothing of tokens x vocab.
    assert max(chunked) <= max(tokens, vocab) * hidden


def test_chunk_rows_keep_a_chunk_within_its_budget():
    assert chunk_rows(49_152) == 1344 and 1344 * 49_152 <= chunked_ce.CHUNK_LOGITS  # the reference vocabulary
    assert chunk_rows(512) % 64 == 0 and chunk_rows(10**9) == 1 and chunk_rows(100, budget=5_000) == 50


def test_under_fp16_the_gradient_is_formed_after_the_loss_scale():
    """fp16 matrix products with a GradScaler's scale of 2**16 on the loss. Formed in the backward pass (what the
    chunked loss does under fp16), the head's gradient is as accurate as the unfused loss's under autocast;
    formed in the forward pass, before the scale, (softmax - onehot) / tokens underflows fp16 for most of the
    vocabulary (probabilities near 1/8192 over 4096 tokens are below 2**-24) and the gradient is off by 10 %."""
    tokens, hidden, vocab = 4096, 16, 8192
    g = torch.Generator().manual_seed(0)
    h = (0.1 * torch.randn(tokens, hidden, generator=g)).requires_grad_()
    w = (0.1 * torch.randn(vocab, hidden, generator=g)).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g)
    scale = 2.0**16
    _, gh_ref, gw_ref = loss_and_grads(lambda h, w, y: F.cross_entropy(F.linear(h, w), y), h, w, y)
    _, gh_unfused, gw_unfused = loss_and_grads(
        lambda h, w, y: F.cross_entropy(F.linear(h.half(), w.half()).float(), y), h, w, y, scale)

    def error(grad_in_forward):
        _, gh, gw = loss_and_grads(lambda h, w, y: linear_cross_entropy(
            h, w, y, dtype=torch.float16, rows=1024, grad_in_forward=grad_in_forward), h, w, y, scale)
        return max(float((a / scale - b).norm() / b.norm()) for a, b in ((gh, gh_ref), (gw, gw_ref)))

    unfused = max(float((a / scale - b).norm() / b.norm()) for a, b in ((gh_unfused, gh_ref), (gw_unfused, gw_ref)))
    assert unfused < 1e-3
    assert error(grad_in_forward=None) < 2 * unfused  # None: the default, which is the backward pass under fp16
    assert error(grad_in_forward=True) > 0.1


def tiny():
    m = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512, max_seq_len=64)
    x = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(0))
    return m, x[:, :-1], x[:, 1:]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_model_with_the_chunked_loss_compiled_and_eager(monkeypatch, dtype):
    """Through ``micro_loss_fn`` as a session builds it: the model and the chunked loss compiled as one graph
    (dynamo and AOTAutograd, as on CUDA; the aot_eager backend leaves out only the code generation) against
    eager, two steps each. fp32: equal within the tolerances above. bf16 autocast: compiling the model alone
    (the unfused loss) moves its gradients by up to 1e-3 on the CPU; the chunked loss compiled moves them no
    more than that."""
    monkeypatch.setattr(chunked_ce, "CHUNK_LOGITS", 40 * 512)  # chunks of 40 rows: 128 tokens are 4 chunks
    m, x, y = tiny()
    cases = [("plain", False, False), ("eager", "chunked", False), ("compiled", "chunked", True)]
    if dtype is not None:
        cases.append(("plain compiled", False, True))
    runs = {}
    for name, fused, comp in cases:
        model = build_model(m, "cpu", seed=0)
        fn = micro_loss_fn(dtype, compiled=comp, backend="aot_eager", fused=fused)
        losses = []
        for _ in range(2):
            loss = fn(model, x, y)
            loss.backward()
            losses.append(loss.detach())
        assert getattr(fn, "fell_back", None) is None
        runs[name] = (torch.stack(losses), [p.grad for p in model.parameters()])

    def apart(a, b):
        return max(float((u - v).abs().max()) for u, v in zip(runs[a][1], runs[b][1]))

    if dtype is None:
        for other in ("eager", "compiled"):
            assert torch.allclose(runs[other][0], runs["plain"][0], rtol=LOSS_RTOL, atol=0)
            assert apart(other, "plain") <= GRAD_ATOL
    else:
        assert torch.allclose(runs["compiled"][0], runs["eager"][0], rtol=1e-3, atol=0)
        assert apart("compiled", "eager") <= max(apart("plain compiled", "plain"), GRAD_ATOL)
