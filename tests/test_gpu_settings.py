"""GPU settings decided on any machine: which attention kernel may run where, when the fused cross-entropy
is on, and what train.deterministic switches. The decisions are pure functions of what the device reports,
tested on the capability tuples real GPUs report; the session-level refusals run for real on CPU."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from baton.config import ModelConfig, load_config
from baton.errors import ConfigError
from baton.model.llama import build_model
from baton.runtime import determinism, fused_ce
from baton.runtime.attention import refusal
from baton.runtime.autotune import resolve
from baton.session.core import Session


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_eager_and_sdpa_run_everywhere(attn):
    assert refusal(attn, "cpu", None, False) is None
    assert refusal(attn, "cuda", (7, 5), False) is None


def test_flash_attention_2_needs_sm80_cuda_and_the_package():
    t4 = refusal("flash_attention_2", "cuda", (7, 5), True, "Tesla T4")
    assert t4 == ("model.attn='flash_attention_2' needs a GPU of compute capability 8.0 or newer (Ampere+), and "
                  "Tesla T4 is 7.5 (use model.attn='sdpa', or 'eager')")
    assert "V100" in refusal("flash_attention_2", "cuda", (7, 0), True, "Tesla V100") and "7.0" in \
        refusal("flash_attention_2", "cuda", (7, 0), True, "Tesla V100")
    for cap in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0)]:  # A100, RTX 3090, L4, H100/H200, B200
        assert refusal("flash_attention_2", "cuda", cap, True) is None
    assert "pip install flash-attn" in refusal("flash_attention_2", "cuda", (9, 0), False)
    assert "needs a CUDA GPU" in refusal("flash_attention_2", "cpu", None, True)
    for cap, installed in [((7, 5), True), ((9, 0), False)]:
        assert "\n" not in refusal("flash_attention_2", "cuda", cap, installed)


def test_session_refuses_flash_attention_2_at_start(make_config):
    cfg = load_config(make_config(), ["model.attn=flash_attention_2"])
    with pytest.raises(ConfigError, match=r"^model.attn='flash_attention_2' needs a CUDA GPU, and this session "
                                          r"runs on cpu \(use model.attn='sdpa'\)$"):
        Session(cfg, resume="never", progress=False)
    assert not cfg.run_dir.exists()  # refused before anything was set up


def test_fused_ce_decision():
    d = fused_ce.decide
    # auto: baton's chunked loss on CUDA, whatever is installed; off on CPU and under FSDP.
    assert d("auto", "cuda") == ("chunked", "cuda") and d("auto", "cuda", True) == ("chunked", "cuda")
    assert d("auto", "cpu", True) == (False, "cpu")
    assert d("auto", "cuda", True, "fsdp") == (False, "train.parallel fsdp")
    assert d(False, "cuda", True) == (False, "off")
    # true is chunked, on any device: plain torch runs everywhere.
    for setting in (True, "chunked"):
        assert d(setting, "cuda") == ("chunked", "set") and d(setting, "cpu") == ("chunked", "set")
    assert d("liger", "cuda", True) == ("liger", "set")
    with pytest.raises(ConfigError, match=r'needs the liger-kernel package \(pip install "baton\[liger\]", or set '
                                          r'train.fused_ce = "chunked"\)'):
        d("liger", "cuda", False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU .* runs on cpu"):
        d("liger", "cpu", True)
    for setting in (True, "chunked", "liger"):
        with pytest.raises(ConfigError, match="does not run under train.parallel='fsdp'"):
            d(setting, "cuda", True, "fsdp")
    with pytest.raises(ConfigError, match="train.fused_ce='yes' is not auto, chunked, liger, true or false"):
        load_config(None, ["train.fused_ce=yes"])


def test_fused_ce_resolves_on_this_machine(make_config):
    cfg = load_config(make_config())
    notes = resolve(cfg, torch.device("cpu"), 1)
    assert cfg.train.fused_ce is False and notes["fused_ce"] == "auto -> False (cpu)"
    cfg = load_config(make_config(), ["train.fused_ce=true"])
    assert "fused_ce" not in resolve(cfg, torch.device("cpu"), 1) and cfg.train.fused_ce == "chunked"
    with pytest.raises(ConfigError, match="train.fused_ce='liger' needs a CUDA GPU"):
        resolve(load_config(make_config(), ["train.fused_ce=liger"]), torch.device("cpu"), 1)


def test_fused_head_inputs_give_the_models_logits():
    # The fused loss multiplies these two itself; through the head they must give the model's own logits.
    m = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512, max_seq_len=64)
    model = build_model(m, "cpu", seed=0)
    x = torch.randint(0, 512, (2, 16))
    h, w = fused_ce.head_inputs(model, x)
    assert h.shape == (32, 64) and w is model.lm_head.weight
    assert torch.equal(F.linear(h, w), model(input_ids=x).logits.reshape(32, 512))


def test_deterministic_switch(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    assert load_config(None).train.deterministic is False
    assert load_config(None, ["train.deterministic=true"]).train.deterministic is True
    before = torch.backends.cudnn.benchmark
    try:
        determinism.enable()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert os.environ["FLASH_ATTENTION_DETERMINISTIC"] == "1"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:  # process-wide state: restored for the tests that follow
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, before
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other deterministic setting is kept
    try:
        determinism.enable()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, before


def fake_gpu(monkeypatch, capability: tuple[int, int], name: str) -> torch.device:
    """A CUDA device as autotune sees one: only what it asks torch.cuda about it."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return torch.device("cuda", 0)


# micro_batch and the attention fixed: their probes would need a real GPU (the attention's is tested below).
ON_GPU = ["train.micro_batch=4", "train.compile=false", "model.attn=sdpa"]


def test_fused_ce_logit_gradients_underflow_in_fp16_before_the_loss_scale():
    # What liger's fused head does: (softmax - onehot) / tokens written into the fp16 logits buffer in the
    # forward pass; the GradScaler's scale multiplies it only in backward. The unfused loss's backward
    # produces the same gradient already scaled, in the same dtype.
    tokens, vocab, scale = 4 * 1024, 49_152, 2.0**16
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, vocab), dim=-1)  # 4 positions of an early-training distribution
    fused = (probs / tokens).half().float() * scale
    unfused = (probs / tokens * scale).half().float()
    assert (fused == 0).float().mean() > 0.9  # most of the vocabulary's gradient is gone
    assert int((unfused == 0).sum()) == 0  # the scaled gradient keeps every entry
    # The boundary: the smallest fp16 step is 2**-24, so a probability below 2**-25 * tokens (1.2e-4) is zero.
    edge = 2.0**-25 * tokens
    assert float(torch.tensor(edge * 0.99 / tokens).half()) == 0 and float(torch.tensor(edge * 1.01 / tokens).half()) > 0
    assert 2.0**-24 * tokens == pytest.approx(2.44e-4, rel=1e-3)
    # bf16 has fp32's exponent range: no entry underflows there, which is why bf16 keeps the fused loss.
    assert int(((probs / tokens).bfloat16() == 0).sum()) == 0


def test_liger_is_refused_under_fp16_and_auto_takes_the_chunked_loss_there(monkeypatch):
    from baton.config import FUSED_CE_FP16

    line = ('train.fused_ce=\'liger\' does not run under precision fp16: its kernel makes the logits\' gradient in '
            'fp16 before the loss scale applies, and most of it rounds to zero (set train.fused_ce = "chunked", '
            '"auto" or false, or train.precision = "bf16" on an Ampere or newer GPU)')
    assert FUSED_CE_FP16 == line
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.fused_ce=liger", "train.precision=fp16"])
    assert str(e.value) == f"invalid config: {line}"
    load_config(None, ["train.fused_ce=true", "train.precision=fp16"])  # the chunked loss scales first: allowed
    # On a T4, precision auto becomes fp16: auto takes the chunked loss, liger is refused in the same line.
    monkeypatch.setattr(fused_ce, "installed", lambda: True)
    t4 = fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    cfg = load_config(None, ["train.precision=auto", *ON_GPU])
    notes = resolve(cfg, t4, 1)
    assert cfg.train.precision == "fp16" and cfg.train.fused_ce == "chunked" and notes["fused_ce"] == \
        "auto -> chunked (cuda)"
    with pytest.raises(ConfigError) as e:
        resolve(load_config(None, ["train.precision=auto", "train.fused_ce=liger", *ON_GPU]), t4, 1)
    assert str(e.value) == line
    # On an H100 auto picks bf16 and the chunked loss with it; liger only when asked for.
    h100 = fake_gpu(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3")
    cfg = load_config(None, ["train.precision=auto", *ON_GPU])
    resolve(cfg, h100, 1)
    assert cfg.train.precision == "bf16" and cfg.train.fused_ce == "chunked"
    cfg = load_config(None, ["train.precision=auto", "train.fused_ce=liger", *ON_GPU])
    resolve(cfg, h100, 1)
    assert cfg.train.fused_ce == "liger"


def test_bf16_below_ampere_is_refused_in_one_line(monkeypatch):
    t4 = fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(ConfigError) as e:
        resolve(load_config(None, ["train.precision=bf16", "train.fused_ce=false", *ON_GPU]), t4, 1)
    assert str(e.value) == ("train.precision=bf16 needs a GPU with bf16 tensor cores (compute capability 8.0 or "
                            "newer), and Tesla T4 is 7.5 (set train.precision = \"fp16\", or \"auto\", which picks "
                            "fp16 there)")
    a100 = fake_gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB")
    cfg = load_config(None, ["train.precision=bf16", "train.fused_ce=false", *ON_GPU])
    resolve(cfg, a100, 1)
    assert cfg.train.precision == "bf16"


def test_a_liger_kernel_that_does_not_import_counts_as_absent(tmp_path, monkeypatch, caplog):
    # Installed, so find_spec sees it, but broken (built for another Triton): auto must stay off, not crash later.
    pkg = tmp_path / "liger_kernel"
    (pkg / "transformers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "transformers" / "__init__.py").write_text("raise RuntimeError('triton 9.9 is required')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("liger_kernel")]:
        monkeypatch.delitem(sys.modules, name)
    assert importlib.util.find_spec("liger_kernel") is not None
    with caplog.at_level("WARNING"):
        assert fused_ce.installed() is False
    assert "liger-kernel is installed but does not import (RuntimeError: triton 9.9 is required)" in caplog.text


def test_attn_auto_is_sdpa_from_ampere_on_without_measuring(monkeypatch):
    from baton.runtime import attention

    monkeypatch.setattr(attention, "measure", lambda *a, **k: pytest.fail("measured on a GPU that needs no measuring"))
    torch_order = torch._C._get_sdp_priority_order()
    for cap, name in (((8, 0), "NVIDIA A100-SXM4-80GB"), ((9, 0), "NVIDIA H200")):
        cfg = load_config(None, ["train.micro_batch=4", "train.compile=false"])
        assert cfg.model.attn == "auto"  # the default
        try:
            notes = resolve(cfg, fake_gpu(monkeypatch, cap, name), 1)
            order = torch._C._get_sdp_priority_order()
        finally:
            attention.ORDER.leave()  # what a session's close does
        assert cfg.model.attn == "sdpa"
        if cap < (9, 0):  # torch's own order (flash first, cuDNN last)
            assert notes["attn"] == f"auto -> sdpa (compute capability {cap[0]}.{cap[1]})" and order == torch_order
            continue
        # Hopper: SDPA's cuDNN kernel first, then flash, set for the session and recorded.
        assert notes["attn"] == "auto -> sdpa (compute capability 9.0); SDPA kernels in order cudnn, flash, efficient, math"
        assert notes["sdpa_priority"] == ["cudnn", "flash", "efficient", "math"]
        from torch.nn.attention import SDPBackend

        assert order[:2] == [int(SDPBackend.CUDNN_ATTENTION), int(SDPBackend.FLASH_ATTENTION)]
    assert torch._C._get_sdp_priority_order() == torch_order  # left: torch's own order again


def test_the_sdpa_order_is_set_only_where_auto_asks_for_it():
    from baton.runtime.attention import SDPA_PRIORITY, sdpa_priority

    assert sdpa_priority("auto", "cuda", (9, 0), False, True) == SDPA_PRIORITY == ("cudnn", "flash", "efficient", "math")
    assert sdpa_priority("auto", "cuda", (10, 0), False, True) == SDPA_PRIORITY
    assert sdpa_priority("auto", "cuda", (8, 9), False, True) is None  # Ada, Ampere: torch's order
    assert sdpa_priority("sdpa", "cuda", (9, 0), False, True) is None  # chosen by hand: left as torch has it
    assert sdpa_priority("auto", "cuda", (9, 0), True, True) is None  # deterministic: flash's backward
    assert sdpa_priority("auto", "cuda", (9, 0), False, False) is None  # a torch that cannot set an order
    assert sdpa_priority("auto", "cpu", None, False, True) is None


@pytest.mark.parametrize("eager_ms, sdpa_ms, want", [(40.0, 61.0, "eager"), (70.0, 61.0, "sdpa")])
def test_attn_auto_below_ampere_takes_the_faster_at_the_sessions_shape(monkeypatch, eager_ms, sdpa_ms, want):
    from baton.runtime import attention

    asked = []

    def measure(cfg, impl, device, dtype):
        asked.append((impl, cfg.data.seq_len, cfg.train.micro_batch, dtype))
        return {"eager": eager_ms, "sdpa": sdpa_ms}[impl] / 1000

    monkeypatch.setattr(attention, "measure", measure)
    cfg = load_config(None, ["train.micro_batch=4", "train.compile=false", "train.precision=auto", "data.seq_len=1024",
                             "model.max_seq_len=1024"])
    notes = resolve(cfg, fake_gpu(monkeypatch, (7, 5), "Tesla T4"), 1)
    assert cfg.model.attn == want and cfg.train.precision == "fp16"
    assert sorted(asked) == [("eager", 1024, 4, torch.float16), ("sdpa", 1024, 4, torch.float16)]
    assert notes["attn"] == (f"auto -> {want} (compute capability 7.5; forward + backward at the session's shape: "
                             f"sdpa {sdpa_ms:.1f} ms, eager {eager_ms:.1f} ms)")


def test_attn_auto_is_recorded_in_the_summary_the_ledger_and_the_report(make_config, tmp_path):
    import json

    import baton
    from baton.guard import local_store_root

    cfg = load_config(make_config(), ["model.attn=auto", "train.steps=2"])
    summary = baton.train(cfg, progress=False)
    assert summary["auto_settings"]["attn"] == "auto -> sdpa (cpu)"
    store = local_store_root(cfg.store.url)
    (record,) = [json.loads(p.read_text()) for p in (store / cfg.run.name / "ledger").glob("*.json")]
    assert record["settings"]["model.attn"] == "auto -> sdpa (cpu)"
    saved = json.loads((store / cfg.run.name / "ckpt" / "step-2" / "state.json").read_text())
    assert saved["config"]["model"]["attn"] == "sdpa"  # the checkpoint's config says what ran
    from baton.report import gather, write_report

    write_report(gather(cfg), tmp_path / "report")
    assert "- session 1: model.attn: auto -> sdpa (cpu)" in (tmp_path / "report" / "report.md").read_text()
