"""The session planner: the reference run's numbers exactly, and contiguous sessions for any input."""

import json
import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.errors import BatonError
from baton.planning.plan import (
    HOUR,
    PlanInput,
    Quota,
    capacity,
    parse_count,
    parse_hours,
    parse_instant,
    parse_margin,
    plan,
    session_seconds,
)
from baton.planning.tripwires import apply_tripwires, evaluate_tripwires, parse_tripwire

TPS = 262_144  # 4 x 1024 x 32 x 2 ranks
T0 = datetime(2026, 9, 20, 6, 0, tzinfo=timezone.utc)


def reference_input(**kw) -> PlanInput:
    """The reference run's inputs, all from its preflight report:

    - horizon: 1e9 target tokens at 262,144 tokens/step -> int(1e9 / 262,144) = 3,814 steps;
    - rate 9,696 tok/s, the rate with activation checkpointing on (27.04 s/step);
    - sessions of 9 h with a 30 % margin -> 6.3 usable hours (the launcher's `usable_hours 6.3`);
    - a checkpoint every 381 steps (10 %), 16.5 s per cycle (the slowest measured push+verify).

    6.3 h holds at most 837 such steps, so 3,814 steps need 5 sessions; 3,814 // 5 = 762 each and the
    last runs to the horizon: 0 -> 762 -> 1,524 -> 2,286 -> 3,048 -> 3,814.
    """
    base = dict(total_steps=int(1e9) // TPS, tokens_per_step=TPS, rate=9_696.0, session_hours=9.0,
                margin_hours=parse_margin("30%", 9.0), ckpt_seconds=16.5, ckpt_every=381, target_tokens=10**9,
                start=T0)
    return PlanInput(**(base | kw))


def test_reference_sessions():
    inp = reference_input()
    assert inp.total_steps == 3814 and inp.total_steps * TPS == 999_817_216
    assert inp.usable_seconds == pytest.approx(6.3 * HOUR)
    assert capacity(inp, 0) == 837
    p = plan(inp)
    bounds = [p.sessions[0].start_step] + [s.stop_after_steps for s in p.sessions]
    assert bounds == [0, 762, 1524, 2286, 3048, 3814]
    assert [s.steps for s in p.sessions] == [762, 762, 762, 762, 766]
    assert all(s.hours * HOUR <= inp.usable_seconds for s in p.sessions)
    # The sessions follow each other on the calendar and bill their own wall clock.
    assert p.sessions[0].start == T0
    for a, b in zip(p.sessions, p.sessions[1:]):
        assert b.start == a.end
    assert p.billed_hours == pytest.approx(sum(session_seconds(inp, s.start_step, s.stop_after_steps)
                                               for s in p.sessions) / HOUR)


@pytest.mark.parametrize("rate, hours", [(7_732, 35.9), (12_977, 21.4)])
def test_reference_hours(rate, hours):
    p = plan(reference_input(rate=float(rate)))
    assert round(p.target_hours, 1) == hours  # 1e9 tokens / rate / 3600
    assert round(p.stepping_hours, 1) == hours  # the 3,814 steps themselves (999,817,216 tokens)


def test_reference_calendar_respects_the_weekly_quota():
    # 30 h/week, 0.447 h already spent on tests, reset 2026-09-26T00:00Z, at the planning rate 7,732 tok/s.
    reset = parse_instant("2026-09-26T00:00Z")
    inp = reference_input(rate=7_732.0, quota_hours=30.0, quota_reset=reset, used_hours=0.447)
    p = plan(inp)
    assert p.sessions[-1].stop_after_steps == 3814
    week1 = sum(s.billed_hours for s in p.sessions if s.end <= reset)
    week2 = sum(s.billed_hours for s in p.sessions if s.start >= reset)
    assert week1 + week2 == pytest.approx(p.billed_hours)  # nobody straddles the reset here
    assert 0.447 + week1 <= 30.0 + 1e-9
    assert week1 > 25  # the first week is used, not abandoned at the first session that does not fit
    assert any(s.start >= reset for s in p.sessions)
    assert any("shortened" in s.note for s in p.sessions)


def _period_usage(p, quota: Quota, used: float) -> dict:
    """Billed hours per quota period, splitting a session across a reset."""
    usage = {quota.period_start(p.input.start): used}
    for s in p.sessions:
        t = s.start
        while t < s.end:
            end = min(s.end, quota.period_end(t))
            key = quota.period_start(t)
            usage[key] = usage.get(key, 0.0) + (end - t).total_seconds() / HOUR * p.input.bill_factor
            t = end
    return usage


def _some_step_fits_no_session(inp: PlanInput) -> bool:
    """Whether a session of one step does not fit somewhere (its cadence checkpoint or the horizon's export tips
    it over): no split exists, and the plan says which step."""
    return any(session_seconds(inp, x, x + 1) > inp.usable_seconds for x in range(inp.start_step, inp.total_steps))


inputs = st.fixed_dictionaries({
    "total_steps": st.integers(1, 20_000),
    "tokens_per_step": st.sampled_from([4_096, 65_536, 262_144]),
    "rate": st.floats(500, 50_000),
    "session_hours": st.floats(0.5, 24),
    "margin_frac": st.floats(0, 0.5),
    "ckpt_seconds": st.floats(0, 120),
    "ckpt_every": st.integers(0, 2_000),
    "start_frac": st.floats(0, 1),
    "startup_seconds": st.floats(0, 600),
})


def _build(d) -> PlanInput:
    return PlanInput(total_steps=d["total_steps"], tokens_per_step=d["tokens_per_step"], rate=d["rate"],
                     session_hours=d["session_hours"], margin_hours=d["session_hours"] * d["margin_frac"],
                     ckpt_seconds=d["ckpt_seconds"], ckpt_every=d["ckpt_every"],
                     start_step=int(d["total_steps"] * d["start_frac"]), startup_seconds=d["startup_seconds"],
                     start=T0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs)
def test_sessions_are_contiguous_and_end_at_the_horizon(d):
    inp = _build(d)
    if _some_step_fits_no_session(inp):
        with pytest.raises(BatonError):
            plan(inp)
        return
    p = plan(inp)
    if inp.start_step == inp.total_steps:
        assert p.sessions == []
        return
    assert p.sessions[0].start_step == inp.start_step
    assert p.sessions[-1].stop_after_steps == inp.total_steps
    for a, b in zip(p.sessions, p.sessions[1:]):
        assert a.stop_after_steps == b.start_step
        assert b.start >= a.end
    for s in p.sessions:
        assert s.steps >= 1
        assert session_seconds(inp, s.start_step, s.stop_after_steps) <= inp.usable_seconds + 1e-6
    # Not more sessions than a capacity that holds anywhere in the run would need.
    lower = capacity(inp, inp.start_step, inp.usable_seconds - 2 * inp.ckpt_seconds)
    if lower > 0:
        assert len(p.sessions) <= math.ceil((inp.total_steps - inp.start_step) / lower)


@settings(max_examples=150, deadline=None)
@given(inputs, st.floats(2, 60), st.floats(0, 1), st.floats(0, 200))
def test_quota_is_never_exceeded(d, quota_hours, used_frac, reset_offset_h):
    inp = _build(d)
    if _some_step_fits_no_session(inp):
        return
    reset = T0 + timedelta(hours=reset_offset_h)
    q = Quota(quota_hours, timedelta(hours=168), reset)
    inp.quota_hours, inp.quota_reset, inp.used_hours = quota_hours, reset, quota_hours * used_frac
    try:
        p = plan(inp)
    except BatonError as e:
        assert "cannot hold a session" in str(e)  # only when no session fits a whole period
        return
    if p.sessions:
        assert p.sessions[-1].stop_after_steps == inp.total_steps
        for a, b in zip(p.sessions, p.sessions[1:]):
            assert a.stop_after_steps == b.start_step and b.start >= a.end
    for period, hours in _period_usage(p, q, inp.used_hours).items():
        assert hours <= quota_hours + 1e-6, f"period {period} bills {hours} h of {quota_hours}"


def test_tripwires_of_the_reference_run():
    wires = [parse_tripwire("below 5,150 tok/s: target=0.9B"), parse_tripwire("7400: micro=8, accum=16")]
    assert wires[0].rate == 5150 and wires[0].target_tokens == 900_000_000
    assert (wires[1].rate, wires[1].micro_batch, wires[1].accum) == (7400, 8, 16)

    def fired(rate):
        return [r.fired for r in evaluate_tripwires(wires, rate, TPS, global_batch=256, seq_len=1024, ranks=2)]

    assert fired(7_732) == [False, False]
    assert fired(7_300) == [False, True]
    assert fired(5_000) == [True, True]
    r = evaluate_tripwires(wires, 5_000, TPS, global_batch=256, seq_len=1024, ranks=2)
    assert all(not x.problem for x in r)  # m8 x accum 16 x 2 ranks x 1024 = 262,144 tokens per step
    assert r[1].overrides == ["train.micro_batch=8"]
    assert r[0].overrides == ["train.target_tokens=900000000", "train.steps=0"]
    cut = apply_tripwires(reference_input(), r)
    assert cut.total_steps == 900_000_000 // TPS == 3433 and cut.tokens_per_step == TPS

    bad = evaluate_tripwires([parse_tripwire("7400: micro=8, accum=8")], 7_000, TPS, global_batch=256, ranks=2)
    assert "not the global batch" in bad[0].problem
    bad = evaluate_tripwires([parse_tripwire("7400: micro=8, accum=8")], 7_000, TPS, seq_len=1024, ranks=2)
    assert "131,072 tokens per step, not 262,144" in bad[0].problem


@pytest.mark.parametrize("text", ["7400", "7400: speed=2", "fast: micro=8", "7400: accum=16", "7400: micro=0"])
def test_bad_tripwires_are_named(text):
    with pytest.raises(BatonError, match="tripwire"):
        parse_tripwire(text)


def test_parsers():
    assert parse_hours("9h") == 9 and parse_hours("90m") == 1.5 and parse_hours("1h30m") == 1.5
    assert parse_hours("2.5") == 2.5 and parse_hours("36s") == 0.01
    assert parse_margin("30%", 9) == pytest.approx(2.7) and parse_margin("45m", 9) == 0.75
    assert parse_count("1e9", "x") == 10**9 and parse_count("0.9B", "x") == 9 * 10**8
    assert parse_count("262,144", "x") == TPS and parse_count("900M", "x") == 9 * 10**8
    assert parse_instant("2026-09-26T00:00Z") == datetime(2026, 9, 26, tzinfo=timezone.utc)
    for bad in (lambda: parse_hours("soon"), lambda: parse_margin("130%", 9), lambda: parse_count("lots", "x"),
                lambda: parse_instant("next friday")):
        with pytest.raises(BatonError):
            bad()


def test_impossible_inputs_are_refused():
    with pytest.raises(BatonError, match="cannot fit one step"):
        plan(reference_input(session_hours=0.01, margin_hours=0.0))
    with pytest.raises(BatonError, match="780 min of startup and a 16.5 s checkpoint cycle: .* the startup"):
        plan(reference_input(startup_seconds=13 * HOUR))
    with pytest.raises(BatonError, match="margin"):
        plan(reference_input(margin_hours=9.0))
    with pytest.raises(BatonError, match="rate"):
        plan(reference_input(rate=0.0))
    with pytest.raises(BatonError, match="cannot hold a session"):
        plan(reference_input(quota_hours=0.1, quota_reset=T0))


def test_plan_command_reference(baton_cli):
    p = baton_cli("plan", "--target-tokens", "1e9", "--tokens-per-step", "262144", "--rate", "9696",
                  "--session-hours", "9h", "--margin", "30%", "--ckpt-seconds", "16.5", "--ckpt-every", "381",
                  "--start", "2026-09-20T06:00Z", "--tripwire", "5150: target=0.9B",
                  "--tripwire", "7400: micro=8, accum=16", "--measured-rate", "7300", "--seq-len", "1024",
                  "--ranks", "2", "--json", check=True)
    out = json.loads(p.stdout)
    assert [s["stop_after_steps"] for s in out["sessions"]] == [762, 1524, 2286, 3048, 3814]
    assert [s["start_step"] for s in out["sessions"]] == [0, 762, 1524, 2286, 3048]
    assert out["total_steps"] == 3814 and out["usable_hours"] == 6.3
    assert [t["fired"] for t in out["tripwires"]] == [False, True]
    assert out["tripwires"][1]["overrides"] == ["train.micro_batch=8"]
    text = baton_cli("plan", "--target-tokens", "1e9", "--tokens-per-step", "262144", "--rate", "7732",
                     "--session-hours", "9", "--margin", "30%", check=True).stdout
    assert "1,000,000,000 tokens at 7,732 tok/s = 35.9 h" in text
    bad = baton_cli("plan", "--target-tokens", "1e9", "--tokens-per-step", "262144", "--session-hours", "9")
    assert bad.returncode == 2 and bad.stderr.startswith("baton: error: plan needs a rate")


def test_edge_inputs_are_one_line_errors_naming_the_fix(capsys, tmp_path, monkeypatch):
    """What a new user mistypes: a horizon off by orders of magnitude, a zero bill factor or measured rate,
    a tripwire at 0 tok/s. Each is one `baton: error:` line (exit 2), never a traceback or a silent default."""
    from support.boundary import assert_input_error, run_in_process

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    base = ["plan", "--tokens-per-step", "1000", "--rate", "100", "--session-hours", "2"]
    for extra, expect in [
        (["--steps", "1e30"], "is beyond any run (at most 1e+18)"),
        (["--steps", "1e9", "--quota-hours", "0.5"], "more than 100,000"),
        (["--steps", "100", "--bill-factor", "0"], "--bill-factor: must be > 0"),
        (["--steps", "100", "--session-hours", "0"], "--session-hours must be > 0, got '0'"),
        (["--steps", "100", "--tripwire", "0: target=1B", "--measured-rate", "50"], "rate must be > 0"),
        (["--steps", "100", "--tripwire", "200: steps=50", "--measured-rate", "0"], "--measured-rate '0' must be > 0"),
        (["--steps", "2.5"], "--steps '2.5' is not a whole number"),
        (["--steps", "100", "--target-tokens", "1e9"], "give the horizon once: --steps or --target-tokens, not both"),
        (["--steps", "100", "--rate-from", "x.json"], "give the rate once: --rate or --rate-from, not both"),
        (["--steps", "100", "--quota-hours", "5", "--quota-period-days", "1e-12"],
         "--quota-period-days: must be >= 0.000694444"),
        (["--steps", "100", "--quota-hours", "5", "--quota-period-days", "1e9"], "is longer than a century"),
        (["--steps", "100", "--start", "9999-12-31T00:00Z"], "is outside the years 1970 to 9000"),
        (["--steps", "100", "--start", "0001-01-01T00:00+05:00"], "is outside the years 1970 to 9000"),
        (["--steps", "100", "--gap", "1e9"], "--gap '1e9' is longer than a century"),
        (["--steps", "100", "--set", "budget.quota_hours=5"], "--set budget.quota_hours=5 needs --config"),
        (["--steps", "100", "--tripwire", "200: steps=50, target=1000", "--measured-rate", "50"],
         "a horizon is target= or steps=, not both"),
        (["--steps", "100", "--tripwire", "200: micro=2.6", "--measured-rate", "50"], "is not a whole number"),
    ]:
        assert_input_error(run_in_process(base + extra, capsys), expect)
    # A rate keeps its fraction: a slow machine's 0.4 tok/s is a rate, not "must be > 0".
    plan_json = run_in_process(["plan", "--tokens-per-step", "10", "--rate", "0.4", "--session-hours", "2",
                                "--steps", "3", "--json"], capsys)
    assert plan_json.status == 0 and json.loads(plan_json.stdout)["rate_tokens_per_s"] == 0.4


def test_a_session_after_a_spent_quota_says_it_waits_for_the_reset():
    p = plan(reference_input(quota_hours=30.0, quota_reset=T0, used_hours=30.0))
    first = p.sessions[0]
    assert first.start == T0 + timedelta(days=7) and first.note == "waits for the quota reset"
    assert all(s.note == "" for s in p.sessions[1:]) and p.warnings == []
    # Overdrawn (a session ran on past the quota, as the ledger records it): a plan from the reset, not an error.
    over = plan(reference_input(quota_hours=30.0, quota_reset=T0, used_hours=31.5))
    assert [(s.start, s.stop_after_steps) for s in over.sessions] == [(s.start, s.stop_after_steps) for s in p.sessions]
    assert over.warnings == ["31.50 h used is more than the quota of 30 h: the plan starts at the next reset, "
                             "2026-09-27T06:00Z"]


def test_a_micro_batch_switch_or_a_cut_that_train_would_refuse_is_a_problem_not_an_override():
    r = evaluate_tripwires([parse_tripwire("1000: micro=3"), parse_tripwire("1000: target=100")], 500, 256,
                           global_batch=8, seq_len=32, ranks=1, total_steps=100)
    assert r[0].problem == "micro 3 x 1 rank(s) does not divide the global batch of 8 samples"
    assert r[1].problem == "a target of 100 tokens is less than one step of 256 tokens"
    ok = evaluate_tripwires([parse_tripwire("1000: micro=2")], 500, 256, global_batch=8, seq_len=32, ranks=2)
    assert ok[0].problem == "" and ok[0].overrides == ["train.micro_batch=2"]


def test_tripwires_that_cannot_do_what_they_say_are_named_and_not_applied():
    # Without a config: one rank (the bill factor's default) and --seq-len are enough to check a switch.
    bad = evaluate_tripwires([parse_tripwire("7400: micro=7, accum=16")], 7_000, TPS, seq_len=2048, ranks=1)
    assert bad[0].problem == "micro x accum x ranks x seq_len = 229,376 tokens per step, not 262,144"
    # "Cut the target" to more than the plan trains cuts nothing, and the plan after the tripwires stays.
    inp = reference_input()
    r = evaluate_tripwires([parse_tripwire("5150: target=2B"), parse_tripwire("5150: steps=4000")], 5_000, TPS,
                           total_steps=inp.total_steps)
    assert [x.fired for x in r] == [True, True]
    assert "7,629 steps, not below the planned 3,814" in r[0].problem and "not below the planned" in r[1].problem
    assert apply_tripwires(inp, r).total_steps == inp.total_steps


def test_plan_without_a_config_checks_a_micro_batch_switch(capsys, tmp_path, monkeypatch):
    from support.boundary import run_in_process

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    o = run_in_process(["plan", "--target-tokens", "1e9", "--tokens-per-step", "262144", "--rate", "9696",
                        "--session-hours", "9", "--tripwire", "7400: micro=7, accum=16", "--measured-rate", "7300",
                        "--seq-len", "2048", "--json"], capsys)
    assert o.status == 0, o.stderr
    (wire,) = json.loads(o.stdout)["tripwires"]
    assert wire["fired"] and wire["problem"] == "micro x accum x ranks x seq_len = 229,376 tokens per step, not 262,144"


def test_cap_warnings_say_what_is_left_or_that_it_is_spent():
    p = plan(reference_input(cap_left_hours=10.0))
    assert p.warnings == [f"the plan bills {p.billed_hours:,.1f} h but the cap leaves 10.0 h"]
    spent = plan(reference_input(total_steps=10, cap_left_hours=-0.0299))
    assert spent.warnings == [f"the plan bills {spent.billed_hours:.3g} h but the cap is already spent (0.0299 h over)"]


def test_a_step_that_fits_no_session_is_named_not_searched_for():
    """Each step fits a session except the last, whose horizon export adds a cycle: the plan names it in one line
    (it used to add sessions without end, looking for a split that does not exist)."""
    inp = PlanInput(total_steps=15_527, tokens_per_step=262_144, rate=500.0, session_hours=0.5,
                    margin_hours=0.5 * 0.4449, ckpt_seconds=101.3, ckpt_every=234, startup_seconds=327.2, start=T0)
    assert capacity(inp, 0) == 1
    with pytest.raises(BatonError) as e:
        plan(inp)
    assert str(e.value).startswith("a session of step 15527 alone needs 1054 s (524.3 s for the step, 327.2 s of "
                                   "startup and 2 checkpoint cycles of 101.3 s, the horizon export among them), "
                                   "more than the 999 s a session has: lengthen the session")


def test_the_calendar_never_prints_a_session_starting_before_the_last_one_ends(capsys):
    """Ends are rounded up to the minute (a deadline at the printed time is met); starts are rounded the same
    way, so a session that begins as the last one ends is not shown a minute inside it. A headline under an
    hour keeps its digits."""
    from baton.cli import main

    # 1.02 s a step: session ends fall inside minutes, not on them
    assert main(["plan", "--target-tokens", "8192000", "--tokens-per-step", "8192", "--rate", "8000",
                 "--session-hours", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "8,192,000 tokens at 8,000 tok/s = 0.284 h;" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "→" in line]
    times = [(datetime.fromisoformat(r[3].replace("Z", "+00:00")), datetime.fromisoformat(r[4].replace("Z", "+00:00")))
             for r in rows]
    assert len(times) >= 5
    assert all(end <= nxt for (_, end), (nxt, _) in zip(times, times[1:])), times
