"""benchmarks/gpu_check.py's smoke mode: the whole flow of the GPU proof (a process per case, the table,
the JSON) on CPU with a 2-layer model, so the script cannot rot between the rare runs on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_ON_CPU = ("fp16", "bf16", "fp32", "fp16_fused", "base", "fused_ce", "muon", "eval_probe", "resume_det",
              "resume_nondet", "fsdp_fp16", "ckpt", "eager", "cli", "attn_kernel")


def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "gpu_check.json"
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--smoke", "--out", str(out), "--work", str(tmp_path / "work")]
    # The timeout only catches a hang: the run takes seconds on a quiet machine, minutes on a loaded one.
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = {r["case"]: r for r in res["cases"]}
    assert res["smoke"] is True and res["failed"] == [] and "partial" not in res
    # Each case's line carries its figures as it ends (a run cut short has them on screen and on disk).
    assert any(line.startswith("base: ok") and "tokens_per_s " in line for line in p.stdout.splitlines()), p.stdout
    for name in RUN_ON_CPU:
        assert rows[name]["status"] == "ok", rows[name]
    # Nothing that needs CUDA is passed off as run.
    for name in ("flash2", "liger", "syncs"):
        assert rows[name]["status"] == "skipped: no CUDA"
    assert rows["compile"]["status"].startswith("skipped: smoke")
    assert rows["compile_cache"]["status"].startswith("skipped: smoke")
    assert rows["trainer_defaults"]["status"].startswith("skipped: smoke")
    # The attention auto picks, found by name in a profile of one step (on CPU: SDPA's flash kernel for the CPU).
    attn = rows["attn_kernel"]
    assert attn["attn"] == "sdpa" and attn["checks"] == {"attention_kernel_found": True} and attn["sdpa_priority"] is None
    assert "flash" in attn["attention_kernels"]
    trainer = "ok" if importlib.util.find_spec("accelerate") else "skipped: accelerate not installed"
    assert rows["trainer"]["status"].startswith(trainer)
    # Precision: the GradScaler exactly for fp16, losses finite and falling.
    for name in ("fp16", "bf16", "fp32"):
        r = rows[name]
        assert r["precision"] == name and r["scaler_enabled"] == (name == "fp16")
        assert r["checks"] == {"finite": True, "falling": True, "scaler_live_exactly_when_fp16": True}
        assert r["loss_last_quarter"] < r["loss_first_quarter"]
    # Resume: with train.deterministic bit-identical (on CPU without it too).
    assert rows["resume_det"]["deterministic"] is True and rows["resume_det"]["bit_identical"] is True
    assert rows["resume_nondet"]["deterministic"] is False and rows["resume_nondet"]["checks"]["loss_within_rtol"]
    # Speed rows measure on CPU but claim no MFU (no peak to divide by), and no target is judged.
    for name in ("base", "ckpt", "eager", "fused_ce", "muon"):
        assert rows[name]["tokens_per_s"] > 0 and rows[name]["mfu"] is None
    assert rows["ckpt"]["grad_ckpt"] is True and rows["eager"]["attn"] == "eager"
    assert rows["fused_ce"]["fused_ce"] == "chunked" and rows["base"]["fused_ce"] is False
    # Muon's step against AdamW's, derived from the two rows; no target is judged on CPU.
    assert rows["muon_step"]["status"] == "ok" and rows["muon_step"]["ratio"] > 0
    assert res["verdicts"]["muon_step_ratio"] == rows["muon_step"]["ratio"]
    # fp16 + GradScaler: the unfused and the chunked loss's head gradients both match fp32 (liger where installed).
    f16 = rows["fp16_fused"]
    assert f16["checks"]["unfused_fp16_head_grad_within_5pct_of_fp32"]
    assert f16["checks"]["chunked_fp16_head_grad_within_5pct_of_fp32"]
    assert rows["micro_auto"]["status"] == "ok" and rows["micro_auto"]["micro_batch"] == rows["base"]["micro_batch"]
    # The evaluation after the probe: every held-out window, in forwards the logits budget allows.
    ev = rows["eval_probe"]
    assert ev["checks"] == {"evaluated_without_running_out_of_memory": True} and ev["val_windows"] == 16
    assert 1 <= ev["eval_micro_batch"] <= ev["micro_batch"]
    # Two ranks (gloo here, NCCL on the GPU): an overflow on one rank's shard skipped the step on both.
    assert rows["fsdp_fp16"]["checks"] == {"overflow_on_one_shard_skips_every_rank": True, "clean_step_updates": True}
    # Each rank's own record: at step 0 only rank 1's shard overflowed, both skipped and halved the scale; step 1
    # is clean, so both update and keep the scale.
    r0, r1 = (json.loads((tmp_path / "work" / "cases" / "fsdp_fp16" / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert r0[0]["own_grads_finite"] is True and r1[0]["own_grads_finite"] is False
    for r in (r0, r1):
        assert r[0]["weights_unchanged"] is True and (r[0]["scale_before"], r[0]["scale_after"]) == (1024.0, 512.0)
        assert r[1]["weights_unchanged"] is False and (r[1]["scale_before"], r[1]["scale_after"]) == (512.0, 512.0)
    # The commands as a person types them, every device setting at auto: each exited 0, preflight passed, the
    # SIGTERM'd session stopped mid-run and the next one, on an emptied run folder, resumed there and finished.
    cli = rows["cli"]
    assert cli["checks"] == {"bench_two_cells_ok": True, "preflight_pass": True, "sigterm_stopped_mid_run": True,
                             "resumed_where_it_stopped": True, "run_complete": True, "sample_printed": True}
    assert list(cli["commands_seconds"]) == ["prepare", "bench", "preflight", "train (SIGTERM)", "train (resume)",
                                             "export", "eval", "sample"]
    assert cli["auto_settings"]["attn"] == "auto -> sdpa (cpu)"
    # The Trainer race ran the same steps on both sides.
    if rows["trainer"]["status"] == "ok":
        assert rows["trainer"]["steps_each"] == 4 and rows["trainer"]["steps_measured"] == 3
    # Nothing measured on a CPU is held against the GPU's targets.
    assert [k for k, v in res["verdicts"].items() if k.endswith("_met") and v is not None] == []
    assert res["verdicts"]["mfu_target"] == 0.45 and res["verdicts"]["trainer_target"] == 1.1
    assert all(r["wall_seconds"] >= 0 for r in res["cases"])
    # One table with a row per case.
    for name in rows:
        assert f"| {name} | {rows[name]['status']} |" in p.stdout
