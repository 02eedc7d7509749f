"""The cadence and the forecast on a real run: a session with budget.ckpt_minutes = "auto" logs the cadence it
chose, and `baton status` and `baton report` on the run in progress show the simulated finish and the cadence."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_auto_cadence_session_then_status_and_report(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    sets = ["--set", "budget.ckpt_minutes=\"auto\"", "--set", "budget.ckpt_seconds=1", "--set", "train.steps=40"]
    t = baton_cli("train", "-c", cfg, "--no-progress", "--stop-after-steps", "10", "--session-hours", "2", *sets,
                  check=True)
    line = next(ln for ln in t.stderr.splitlines() if "checkpoint cadence: auto: " in ln)
    # No interruption in the ledger yet (this session's own record is still open and alive): as if the next
    # session were cut, over the session's own 2 hours.
    assert "as if the next session were cut" in line and "Young/Daly" in line

    st_sets = [*sets, "--set", "budget.session_hours=2"]
    s = json.loads(baton_cli("status", "-c", cfg, "--json", *st_sets, check=True).stdout)
    sim = s["simulated"]
    assert s["pointer_step"] == 10 and sim["p50"] <= sim["p90"] and sim["runs"] == 500
    assert s["cadence"]["auto"] and s["cadence"]["ckpt_minutes"] > 0
    # budget.ckpt_seconds is the config's figure, not a measurement: status says so as plan does.
    assert "the 1 s cycle (config)" in s["cadence"]["reason"] and s["sources"]["ckpt"] == "config"
    plan_text = baton_cli("plan", "-c", cfg, *st_sets, check=True).stdout
    assert "checkpoint cycle 1 s (config)" in plan_text and "the 1 s cycle (config)" in plan_text
    text = baton_cli("status", "-c", cfg, *st_sets, check=True).stdout
    assert f"simulated finish: P50 {sim['p50']}, P90 {sim['p90']} (500 runs at" in text
    assert "checkpoint cadence: auto: " in text

    out = tmp_path / "report"
    baton_cli("report", "-c", cfg, "--out", str(out), *st_sets, check=True)
    md = (out / "report.md").read_text()
    assert "## Forecast" in md and f"finish P50 {sim['p50']}, P90 {sim['p90']}" in md
    assert "![finish](finish.png)" in md and "![cadence](cadence.png)" in md
    assert (out / "finish.png").stat().st_size > 1000 and (out / "cadence.png").stat().st_size > 1000
