"""`baton bench` on CPU: a small grid, an impossible cell recorded as OOM, and --pick."""

import json

import pytest

from baton.bench import Cell, MiB, estimate_bytes, overrides, parse_size, pick
from baton.config import load_config
from baton.errors import BatonError
from baton.runtime.memory import is_oom

CAP_MIB = 64


def test_bench_grid_oom_and_pick(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    out = tmp_path / "bench"
    # 2,048 tokens per step in every cell. Eager attention at 2,048 tokens keeps a 2,048 x 2,048 score
    # matrix per head and layer (~288 MiB): over the cap, so it must be recorded as OOM, not crash.
    p = baton_cli("bench", "-c", cfg, "--attn", "eager,sdpa", "--seq", "256,2048", "--micro", "1,8",
                  "--grad-ckpt", "off", "--tokens-per-step", "2048", "--warmup", "1", "--steps", "2",
                  "--mem-cap", f"{CAP_MIB}MiB", "--out", str(out), "--pick", timeout=300)
    assert p.returncode == 0, p.stderr
    data = json.loads((out / "bench.json").read_text())
    cells = {c["label"]: c for c in data["cells"]}
    assert len(cells) == 8 and data["cap_bytes"] == CAP_MIB * MiB

    impossible = cells["eager s2048 m1x1"]
    assert impossible["status"] == "OOM" and impossible["estimate_bytes"] > CAP_MIB * MiB
    assert impossible["tokens_per_s"] is None
    for label in ("eager s2048 m8", "sdpa s2048 m8"):  # 8 x 2,048 tokens is more than one step holds
        assert cells[label]["status"] == "skipped"
    ran = [c for c in data["cells"] if c["tokens_per_s"] is not None]
    assert len(ran) >= 4
    for c in ran:
        assert c["accum"] * c["micro_batch"] * c["seq_len"] == 2048  # tokens per step fixed by accumulation
        assert c["peak_rss"] > 0 and c["peak_bytes"] >= 0 and c["step_seconds"] > 0
        # A cell is ok exactly when its measured footprint is within the cap.
        assert (c["status"] == "ok") == (c["peak_bytes"] <= CAP_MIB * MiB), c
    ok = [c for c in ran if c["status"] == "ok"]
    best = max(ok, key=lambda c: c["tokens_per_s"])
    assert data["picked"] == best["label"]
    assert f"picked {best['label']}:" in p.stdout

    # The printed overrides make the config train exactly that cell, with the same tokens per step.
    line = next(line for line in p.stdout.splitlines() if line.startswith("overrides: "))
    sets = line.removeprefix("overrides: ").replace("--set ", "").split()
    tuned = load_config(cfg, sets)
    base = load_config(cfg)
    assert (tuned.model.attn, tuned.train.micro_batch, tuned.model.grad_ckpt) == (
        best["attn"], best["micro_batch"], best["grad_ckpt"])
    assert tuned.tokens_per_step == 2048 != base.tokens_per_step  # the measured geometry, said so
    assert "note: the bench ran at 2,048 tokens per step" in p.stdout

    md = (out / "bench.md").read_text()
    assert "| eager | 2048 | 1 x 1 |" in md and "OOM: estimated" in md
    assert md.count("\n| eager |") + md.count("\n| sdpa |") == 8
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cell(label_rate, status="ok", peak=10, **kw):
    attn, rate = label_rate
    return Cell(attn, 64, 4, False, False, accum=2, status=status, tokens_per_s=rate,
                peak_bytes=None if peak is None else peak * MiB, **kw)


def test_pick_prefers_the_fastest_cell_under_the_cap():
    cells = [_cell(("eager", 900.0), peak=80), _cell(("sdpa", 700.0), peak=40), _cell(("eager", 500.0), peak=20),
             _cell(("sdpa", 1000.0), status="OOM", peak=None), Cell("sdpa", 64, 8, True, True, accum=1,
                                                                     status="ok", tokens_per_s=5000.0, peak_bytes=0)]
    assert pick(cells[:4]).tokens_per_s == 900.0
    assert pick(cells[:4], cap=64 * MiB).tokens_per_s == 700.0
    assert pick(cells[:4], cap=10 * MiB) is None
    assert pick(cells).tokens_per_s == 900.0  # a compiled cell is not eligible: baton train does not compile
    assert pick(cells, allow_compile=True).tokens_per_s == 5000.0


def test_overrides_keep_tokens_per_step(make_config):
    cfg = load_config(make_config())  # seq 32 x global batch 8 = 256 tokens per step
    cell = Cell("eager", 64, 2, True, False, accum=2)
    sets = overrides(cell, cfg)
    assert "data.seq_len=64" in sets and "train.global_batch=4" in sets
    assert "train.compile=false" in sets  # pinned: auto compiles on a GPU, and this cell was timed uncompiled
    tuned = load_config(make_config(), sets)
    assert tuned.tokens_per_step == cfg.tokens_per_step and tuned.model.grad_ckpt
    # Two ranks at 128 tokens each: the same 256 tokens per step, 4 samples = micro 2 x 2 ranks.
    assert load_config(make_config(), overrides(cell, cfg, 128, ranks=2)).tokens_per_step == 256
    with pytest.raises(BatonError, match="does not divide"):
        overrides(Cell("eager", 96, 1, False, False), cfg)
    with pytest.raises(BatonError, match="not a multiple"):
        overrides(Cell("eager", 64, 8, False, False), cfg)  # 4 samples per step cannot hold micro-batches of 8


def test_estimates_and_sizes(make_config):
    cfg = load_config(make_config())
    eager, sdpa = Cell("eager", 1024, 1, False, False), Cell("sdpa", 1024, 1, False, False)
    assert estimate_bytes(cfg, eager) > estimate_bytes(cfg, sdpa)  # eager keeps the score matrices
    assert estimate_bytes(cfg, Cell("sdpa", 1024, 8, False, False)) > estimate_bytes(cfg, sdpa)
    # A fused loss head holds the logits of one chunk of rows, not of the micro-batch: a cell under a cap is run.
    from baton.runtime.chunked_ce import chunk_rows

    ref = load_config("configs/ref-106m.toml")
    big = Cell("sdpa", 1024, 32, False, False)
    unfused = estimate_bytes(ref, big)
    for setting in (True, "chunked", "liger"):
        ref.train.fused_ce = setting
        assert unfused - estimate_bytes(ref, big) == 3 * (32 * 1024 - chunk_rows(49152)) * 49152 * 4
    ref.train.fused_ce = "auto"
    assert estimate_bytes(ref, big) == unfused  # unresolved: counted as the larger
    assert parse_size("12GiB") == 12 * 1024**3 and parse_size("512MiB") == 512 * MiB
    assert parse_size("8GB") == 8 * 10**9 and parse_size("1000") == 1000
    with pytest.raises(BatonError):
        parse_size("lots")
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes"))
    assert is_oom(MemoryError()) and not is_oom(RuntimeError("shape mismatch"))


def test_bad_caps_and_tokens_per_step_are_one_line_errors(make_config, capsys, tmp_path, monkeypatch):
    """A cap of nothing (or negative, or beyond any float) would record every cell as OOM or crash; 0 tokens
    per step divided by zero. Each is now one `baton: error:` line before any cell runs."""
    from support.boundary import assert_input_error, run_in_process

    for bad in ("0", "-5GiB", "0.5B", "1e400GiB"):
        with pytest.raises(BatonError, match="at least one byte"):
            parse_size(bad)
    assert parse_size("1KiB") == 1024
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = str(make_config())
    o = run_in_process(["bench", "-c", cfg, "--attn", "sdpa", "--tokens-per-step", "0", "--out", str(tmp_path / "b")],
                       capsys)
    assert_input_error(o, "give --tokens-per-step of at least 1")
    # 256 tokens per step over 3 ranks used to floor to 85 per rank: every cell skipped, "no cell ran within the cap".
    o = run_in_process(["bench", "-c", cfg, "--attn", "sdpa", "--ranks", "3", "--out", str(tmp_path / "b")], capsys)
    assert_input_error(o, "256 tokens per step do not split over --ranks 3")
    assert not (tmp_path / "b").exists()


def test_a_tiny_cap_is_shown_as_it_is():
    from baton.bench import _mib

    assert _mib(1024) == "0.000977" and _mib(3.5 * MiB) == "3.5" and _mib(None) == "—"


def test_the_grid_times_the_precision_auto_resolves_to(make_config, monkeypatch):
    # precision = "auto" is bf16 or fp16 on a GPU: the grid must time that, not fp32.
    import torch

    from baton import bench

    timed = []
    monkeypatch.setattr(bench, "resolve_precision", lambda device: "bf16")
    monkeypatch.setattr(bench, "_time_steps", lambda cfg, *a: timed.append(cfg.train.precision) or (1.0, 0.1))
    cfg = load_config(make_config(), ["train.precision=auto"])
    cells = bench.run_grid(cfg, ["sdpa"], [32], [4], [False], [False], 256, torch.device("cpu"), warmup=0, steps=1)
    # On CPU an untimed cell runs first (the process's one-off growth is nobody's cell), then the grid's.
    assert timed == ["bf16", "bf16"] and len(cells) == 1 and cells[0].status == "ok"
    assert cfg.train.precision == "auto"  # the caller's config is left as it was
    assert bench.precision_for(cfg, torch.device("cpu")) == "bf16"

def test_bench_times_the_runs_optimizer_step(make_config, baton_cli, tmp_path):
    """The bench trains with the run's optimizer (Muon here) and reports its step's share of each step."""
    out = tmp_path / "bench"
    p = baton_cli("bench", "-c", str(make_config()), "--set", "optim.name=muon", "--attn", "sdpa", "--seq", "32",
                  "--micro", "4", "--grad-ckpt", "off", "--tokens-per-step", "256", "--warmup", "1", "--steps", "2",
                  "--out", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    data = json.loads((out / "bench.json").read_text())
    assert data["optimizer"] == "muon"
    (cell,) = data["cells"]
    assert cell["status"] == "ok" and 0 < cell["optim_seconds"] < cell["step_seconds"]
    assert "| optimizer s |" in p.stdout and "optimizer muon" in (out / "bench.md").read_text()


def test_the_muon_benchmark_widens_each_grid_until_its_best_is_interior():
    """A baseline whose best lr sits at its grid's edge is not tuned: the grid grows past that edge, by its own
    ratio, until the best is inside it (or says it ran out of room)."""
    import math
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_muon
    finally:
        sys.path.pop(0)

    def loss(lr: float) -> float:  # a valley at 5e-4, and divergence above 0.05
        return math.nan if lr > 0.05 else (math.log2(lr) - math.log2(5e-4)) ** 2

    tried: list[float] = []

    def evaluate(lr: float) -> float:
        tried.append(lr)
        return loss(lr)

    finals = {lr: loss(lr) for lr in (0.002, 0.004, 0.008)}  # the best, 0.002, at the low edge
    assert bench_muon.widened(finals, evaluate, max_widen=6)
    assert tried == pytest.approx([0.001, 0.0005, 0.00025])
    assert min(finals, key=finals.get) == pytest.approx(5e-4) and bench_muon.beyond_edge(finals) is None
    # Upwards, past a diverged run (counted as the worst), and a limit that is not enough is said.
    up = {lr: loss(lr) for lr in (1e-5, 2e-5, 4e-5)}
    assert not bench_muon.widened(up, lambda lr: loss(lr), max_widen=2)
    assert sorted(up)[-1] == pytest.approx(1.6e-4)
    assert bench_muon.beyond_edge({0.1: math.nan, 0.2: math.nan, 0.05: 3.0}) == pytest.approx(0.025)
    assert bench_muon.beyond_edge({0.01: 1.0}) == pytest.approx(0.005)


def test_each_compiled_cell_is_the_sessions_step_compiled_afresh(make_config, monkeypatch):
    """A cell times what `baton train` runs: the session's micro-loss (its fused loss head, its compile scope),
    compiled anew for the cell. Compiled cells sharing one dynamo cache got graphs with dynamic shapes from the
    second shape on, and past the recompile limit ran eagerly while labelled compiled."""
    import torch

    from baton import bench
    from baton.runtime import compiled, fused_ce

    graphs: list[bool] = []  # per graph handed to the backend: whether a size comes in as an input (dynamic)

    def backend(gm, example_inputs):
        graphs.append(any(not isinstance(t, torch.Tensor) for t in example_inputs))  # a size passed in
        return gm.forward

    kinds = []
    real = fused_ce.micro_loss_fn
    monkeypatch.setattr(compiled, "BACKEND", backend)
    monkeypatch.setattr(fused_ce, "micro_loss_fn", lambda kind, *a, **k: kinds.append(kind) or real(kind, *a, **k))
    cfg = load_config(make_config(), ["train.fused_ce=true", "train.compile_scope=model"])
    cells = bench.run_grid(cfg, ["sdpa"], [32], [2, 4, 8], [False], [True], 256, torch.device("cpu"), warmup=1,
                           steps=1)
    assert [c.status for c in cells] == ["ok"] * 3 and not any(c.reason for c in cells)
    assert kinds == ["chunked"] * 4  # the untimed first cell, then the grid's three
    assert len(graphs) >= 3 and not any(graphs), graphs  # static shapes in every cell


def test_a_torch_without_shared_compiled_blocks_is_timed_compiling_the_model_as_training_does(make_config,
                                                                                              monkeypatch):
    """Before torch 2.5 each layer's block would compile anew (past dynamo's recompile limit, partly eager):
    the session compiles the model whole there, and so does the bench cell that stands for it."""
    import torch

    from baton import bench
    from baton.runtime import regional

    scopes = []
    monkeypatch.setattr(bench, "_time_steps", lambda cfg, *a: scopes.append(cfg.train.compile_scope) or (1.0, 0.1))
    cfg = load_config(make_config(), ["train.compile_scope=blocks"])
    monkeypatch.setattr(regional, "supported", lambda: False)
    bench.run_grid(cfg, ["sdpa"], [32], [4], [False], [True], 256, torch.device("cpu"), warmup=0, steps=1)
    monkeypatch.setattr(regional, "supported", lambda: True)
    bench.run_grid(cfg, ["sdpa"], [32], [4], [False], [True], 256, torch.device("cpu"), warmup=0, steps=1)
    assert scopes == ["model", "model", "blocks", "blocks"]  # the untimed first cell, then the grid's
    assert cfg.train.compile_scope == "blocks"  # the caller's config is left as it was
