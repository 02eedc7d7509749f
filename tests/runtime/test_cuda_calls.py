"""Every torch.cuda call that concerns one GPU gets an indexed device (baton/runtime/cuda.py).

Two halves: the source holds no call that could pass a device as it came (read from the AST), and the code
paths that read GPU memory and properties run against a stand-in torch.cuda that refuses a device without
an index, as ``torch.cuda.set_per_process_memory_fraction`` does.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import baton

PACKAGE = Path(baton.__file__).parent
ROUTER = PACKAGE / "runtime" / "cuda.py"
# torch.cuda functions that take no device (or all of them): used directly anywhere.
DEVICE_FREE = {"is_available", "device_count", "is_initialized", "Event", "OutOfMemoryError",
               "get_rng_state_all", "set_rng_state_all"}


def _cuda_attr(node: ast.AST) -> str | None:
    """``X`` for an expression ``torch.cuda.X``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "cuda" and isinstance(node.value.value, ast.Name) and node.value.value.id == "torch":
        return node.attr
    return None


def _names_bare_cuda(node: ast.AST) -> bool:
    """Whether a torch.device(...) argument can be the string "cuda" with no index."""
    return any(isinstance(n, ast.Constant) and n.value == "cuda" for n in ast.walk(node))


def test_no_call_site_passes_a_device_to_torch_cuda_unrouted():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == ROUTER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            attr = _cuda_attr(node)
            if attr is not None and attr not in DEVICE_FREE:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} torch.cuda.{attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "torch" and any(a.name == "cuda" for a in node.names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} from torch import cuda")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.cuda"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} from {node.module} import ...")
            # torch.device("cuda" if ... else "cpu"): a device without its index, handed on to whatever takes it
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" \
                    and len(node.args) == 1 and _names_bare_cuda(node.args[0]):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} torch.device('cuda')")
    assert offenders == [], "route these through baton.runtime.cuda: " + ", ".join(offenders)


class StrictCuda:
    """A stand-in for the torch.cuda functions baton calls: one GPU, and a device argument must name its index."""

    def __init__(self, gpus: int = 1):
        self.calls: list[tuple[str, object]] = []
        self.gpus = gpus
        self.current = 0  # as in a fresh process: torchrun sets no current GPU, every rank starts on 0

    def _index(self, name: str, device) -> int:
        self.calls.append((name, device))
        if isinstance(device, int):
            return device
        if isinstance(device, torch.device) and device.index is not None:
            return device.index
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")

    def install(self, monkeypatch) -> StrictCuda:
        c = torch.cuda
        gib = 2**30
        props = SimpleNamespace(total_memory=80 * gib, name="Stand-in GPU", major=9, minor=0)
        table = {
            "is_available": lambda: True,
            "device_count": lambda: self.gpus,
            "is_initialized": lambda: True,
            "current_device": lambda: self.current,
            "set_device": lambda d: setattr(self, "current", self._index("set_device", d)),
            "get_device_capability": lambda d=None: (self._index("get_device_capability", d), (9, 0))[1],
            "get_device_name": lambda d=None: (self._index("get_device_name", d), "Stand-in GPU")[1],
            "get_device_properties": lambda d=None: (self._index("get_device_properties", d), props)[1],
            "mem_get_info": lambda d=None: (self._index("mem_get_info", d), (70 * gib, 80 * gib))[1],
            "synchronize": lambda d=None: self._index("synchronize", d) and None,
            "empty_cache": lambda: None,
            "reset_peak_memory_stats": lambda d=None: self._index("reset_peak_memory_stats", d) and None,
            "max_memory_allocated": lambda d=None: (self._index("max_memory_allocated", d), 3 * gib)[1],
            "max_memory_reserved": lambda d=None: (self._index("max_memory_reserved", d), 4 * gib)[1],
            "set_per_process_memory_fraction":
                lambda f, d=None: self._index("set_per_process_memory_fraction", d) and None,
            "get_rng_state": lambda d="cuda": (self._index("get_rng_state", d), torch.zeros(8, dtype=torch.uint8))[1],
            "set_rng_state": lambda s, d="cuda": self._index("set_rng_state", d) and None,
        }
        for name, fn in table.items():
            monkeypatch.setattr(c, name, fn)
        return self


@pytest.fixture
def strict_cuda(monkeypatch) -> StrictCuda:
    return StrictCuda().install(monkeypatch)


def test_the_router_indexes_every_spec(strict_cuda):
    from baton.runtime import cuda

    for spec in (torch.device("cuda"), "cuda", None, 0, torch.device("cuda", 0), "cuda:0"):
        assert cuda.capability(spec) == (9, 0)
        assert cuda.name(spec) == "Stand-in GPU"
        assert cuda.total_memory(spec) == 80 * 2**30
        assert cuda.free_memory(spec) == 70 * 2**30
        cuda.reset_peak(spec)
        assert cuda.peak_allocated(spec) == 3 * 2**30 and cuda.peak_reserved(spec) == 4 * 2**30
        cuda.limit_memory(0.5, spec)
        cuda.synchronize(spec)
        cuda.set_rng_state(cuda.rng_state(spec), spec)
    assert cuda.indexed("cuda") == torch.device("cuda", 0)
    assert {type(d) for _, d in strict_cuda.calls} == {int}
    with pytest.raises(ValueError, match="not a CUDA device"):
        cuda.index(torch.device("cpu"))


def test_a_device_picked_for_training_always_names_its_gpu(strict_cuda):
    from baton.runtime.device import pick_device, rank_device

    for spec in ("auto", "cuda", "cuda:0"):
        assert pick_device(spec) == torch.device("cuda", 0)
        assert rank_device(spec, 0, under_torchrun=False) == torch.device("cuda", 0)


def test_under_torchrun_every_rank_trains_on_its_local_gpu_with_the_default_device(monkeypatch):
    """torchrun sets no current GPU: rank 1 of a default config ("auto") must take cuda:1, not read the
    current cuda:0 as a config that names one GPU."""
    from baton.errors import ConfigError
    from baton.runtime.device import rank_device

    for spec in ("auto", "cuda", "cuda:1"):
        strict = StrictCuda(gpus=2).install(monkeypatch)
        assert rank_device(spec, 1, under_torchrun=True) == torch.device("cuda", 1)
        assert strict.current == 1
    StrictCuda(gpus=2).install(monkeypatch)
    with pytest.raises(ConfigError, match=r"train.device='cuda:0' names one GPU.*this one: cuda:1"):
        rank_device("cuda:0", 1, under_torchrun=True)
    strict = StrictCuda(gpus=2).install(monkeypatch)
    assert rank_device("cuda:1", 0, under_torchrun=False) == torch.device("cuda", 1) and strict.current == 1
    assert rank_device("cpu", 1, under_torchrun=True) == torch.device("cpu")


def test_the_memory_and_device_readings_of_the_commands_take_a_bare_cuda(strict_cuda, monkeypatch, tmp_path):
    """What `baton bench`, preflight's throughput stage, the session's autotune and the memory check read on
    a GPU, given the bare ``cuda`` a user's config or an older caller hands them."""
    from baton import bench
    from baton.config import load_config
    from baton.runtime import attention, autotune, flops, memory
    from support.helpers import write_config

    bare = torch.device("cuda")
    cfg = load_config(write_config(tmp_path / "c.toml", data_dir=tmp_path / "d", store=tmp_path / "s",
                                   runs=tmp_path / "r"))
    assert memory.free_bytes(bare) == 70 * 2**30
    assert memory.shortfall(10**6, "ddp", 1, bare) is None
    assert autotune.resolve_precision(bare) == "bf16"
    assert attention.device_refusal("sdpa", bare) is None
    assert flops.session_flops(cfg.model, cfg.data.seq_len, bare, "bf16", 1).device_name == "Stand-in GPU"
    cfg.train.precision, cfg.train.compile, cfg.train.fused_ce = "auto", "auto", False
    notes = autotune.resolve(cfg, bare, 1)
    assert cfg.train.precision == "bf16" and cfg.train.compile is True, notes

    # One bench cell under a memory cap: the model's steps are not what is tested here (no GPU to run them
    # on); the cell's memory window around them is, with the device exactly as the grid passes it.
    monkeypatch.setattr(bench, "_time_steps", lambda *a, **k: (2.0, 0.5))
    cell = bench.Cell(attn="sdpa", seq_len=32, micro_batch=4, grad_ckpt=False, compile=False)
    out = bench.run_cell(cfg, cell, 128, bare, warmup=0, steps=2, cap=40 * 2**30, target_tokens=10**6)
    assert out.status == "ok", out.reason
    assert out.peak_reserved == 4 * 2**30 and out.peak_bytes == 4 * 2**30
    names = {n for n, _ in strict_cuda.calls}
    assert {"set_per_process_memory_fraction", "reset_peak_memory_stats", "max_memory_reserved"} <= names
