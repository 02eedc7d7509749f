"""`baton report` on a three-session run, from a machine that holds nothing of it; the spike watch's record."""

from __future__ import annotations

import json
import shutil

import pytest

import baton
from baton.cli import main
from baton.config import load_config
from baton.data.reader import WindowDataset
from baton.planning.ledger import LedgerRecord, billed_hours
from baton.session.spikes import SpikeDetector


def test_report_of_a_three_session_run_marks_sessions_and_spikes(make_config, prepared_data, tmp_path):
    cfg = str(make_config())
    store, runs, out = tmp_path / "store", tmp_path / "runs", tmp_path / "report"
    common = ["train", "-c", cfg, "--no-progress", "--set", "train.eval_every=5", "--set", "train.spike_window=6"]
    assert main([*common, "--stop-after-steps", "8"]) == 0
    assert main([*common, "--stop-after-steps", "14"]) == 0
    # A session that stops before the horizon reports its newest periodic validation.
    summary = json.loads((runs / "test" / "run_summary.json").read_text())
    row10 = next(json.loads(x) for x in (runs / "test" / "metrics.jsonl").read_text().splitlines()
                 if json.loads(x)["step"] == 10)
    assert (summary["val_step"], summary["val_loss"], summary["val_ppl"]) == (10, row10["val_loss"], row10["val_ppl"])
    assert summary["eval_seconds_max"] == pytest.approx(row10["eval_seconds"], abs=1e-4)  # its only one
    # The third session trains at a learning rate far too high: its loss jumps, a spike against the recent
    # losses, which the resumed spike watch knows from the checkpoint's metrics.
    assert main([*common, "--set", "optim.lr=0.5"]) == 0
    shutil.rmtree(runs)  # the report reads the store alone

    assert main(["report", "-c", cfg, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    doc = json.loads((out / "report.json").read_text())
    for name in ("loss.png", "throughput.png", "hours.png"):
        assert (out / name).stat().st_size > 10_000 and f"]({name})" in md
    assert doc["session_ends"] == [8, 14, 20] and doc["resumes"] == [8, 14]
    assert "Session ends at steps: 8, 14, 20; resumes at steps: 8, 14." in md

    pointer = json.loads((store / "test" / "latest.json").read_text())
    rows = [json.loads(x) for x in (store / "test" / pointer["path"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert f"- last training loss: {rows[-1]['loss']:.4f} (step 20)" in md
    assert f"- last validation: loss {pointer['val_loss']:.4f}, perplexity {pointer['val_ppl']:.2f} (step 20)" in md
    assert [v["step"] for v in doc["val"]] == [5, 10, 15, 20]
    records = sorted((json.loads(p.read_text()) for p in (store / "test" / "ledger").glob("*.json")),
                     key=lambda r: (r["started_ts"], r["steps_from"]))
    assert len(records) == 3
    for i, rec in enumerate(records, 1):
        assert (f"| {i} | {rec['session']} | {rec['started']} | {rec['steps_from']} → {rec['steps_to']} | "
                f"{rec['tokens_per_s']:,.0f} | — | {billed_hours(LedgerRecord.from_json(rec)):.4f} | {rec['outcome']} |") in md
    assert f"- billed: {sum(billed_hours(LedgerRecord.from_json(r)) for r in records):.4f} h over 3 session(s)" in md
    # Each session's start-up, split: pulling, building, the first step (no compile on CPU by default).
    assert "## Start-up" in md
    for i, rec in enumerate(records, 1):
        u = rec["startup"]
        assert u["compile"] == "off" and u["compile_seconds"] is None and u["first_step"] > 0
        assert rec["startup_seconds"] == pytest.approx(u["pull"] + u["build"], abs=2e-3)
        assert (f"| {i} | {u['pull']:.1f} | {u['build']:.1f} | {u['first_step']:.1f} | off | — | "
                f"{u['pull'] + u['build']:.1f} |") in md

    # The spike: judged as a detector that saw every step would judge it, with the exact windows of its batch.
    spiked = [r for r in rows if "spike_score" in r]
    assert spiked and all(r["step"] > 14 for r in spiked)
    detector = SpikeDetector(threshold=6.0, window=6)
    expected = [s.step for r in rows if (s := detector.observe(r["step"], r["loss"])) is not None]
    assert [r["step"] for r in spiked] == expected
    ds = WindowDataset(prepared_data, 32, 7, 16)
    for r in spiked:
        assert r["spike_windows"] == ds.train_window_ids((r["step"] - 1) * 8, 8).tolist()
        assert f"| {r['step']} | {r['loss']:.4f} |" in md
    assert [p["step"] for p in doc["spikes"]] == expected
    assert "- progress: step 20 of 20 (" in md
    # A config naming another horizon does not make the complete run "step 20 of 10".
    assert baton.status(load_config(cfg, ["train.steps=10"]))["total_steps"] == 20
