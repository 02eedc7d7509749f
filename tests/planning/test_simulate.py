"""The relay simulator: the plan exactly when nothing is cut, the closed forms of Poisson interruptions when
sessions are cut, the auto cadence at the optimum, and every bad input refused in one line."""

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from baton.errors import BatonError
from baton.planning.cadence import auto_cadence, observe, optimal_work_seconds, resolve_cadence, young_work_seconds
from baton.planning.ledger import LedgerRecord
from baton.planning.plan import HOUR, PlanInput, cadence_points, capacity, iso_by, parse_margin, plan, session_seconds
from baton.planning.simulate import Interruptions, Outages, SimInput, cadence_curve, curve_minutes, simulate
from baton.session.clock import TimeBudget

TPS = 262_144
T0 = datetime(2026, 9, 20, 6, 0, tzinfo=timezone.utc)


def reference_input(**kw) -> PlanInput:
    """The reference run (tests/planning/test_plan.py): 3,814 steps, 5 sessions of 762 at 9,696 tok/s."""
    base = dict(total_steps=int(1e9) // TPS, tokens_per_step=TPS, rate=9_696.0, session_hours=9.0,
                margin_hours=parse_margin("30%", 9.0), ckpt_seconds=16.5, ckpt_every=381, target_tokens=10**9,
                start=T0)
    return PlanInput(**(base | kw))


def _same_as_plan(inp: PlanInput, runs: int = 3) -> None:
    p = plan(inp)
    r = simulate(SimInput(inp, Interruptions(rate_per_hour=0.0), runs=runs))
    assert (r.sessions == len(p.sessions)).all()
    assert (r.finish == p.eta.timestamp()).all()
    assert (r.billed_hours == p.billed_hours).all() and (r.wall_hours == p.wall_hours).all()
    assert (r.steps_lost == 0).all() and (r.interruptions == 0).all()
    d = r.to_dict()
    assert d["finish"] == {"p10": iso_by(p.eta), "p50": iso_by(p.eta), "p90": iso_by(p.eta)}
    assert d["plan"] == {"sessions": len(p.sessions), "eta": iso_by(p.eta), "billed_hours": round(p.billed_hours, 4)}


# ------------------------------------------------------------------------ 1. no interruptions = the plan


def test_the_reference_run_uninterrupted_is_its_plan():
    inp = reference_input()
    p = plan(inp)
    assert [s.stop_after_steps for s in p.sessions] == [762, 1524, 2286, 3048, 3814]
    _same_as_plan(inp)
    # At the planning rate of 7,732 tok/s (35.9 h of stepping), under the weekly quota, with a timed cadence.
    _same_as_plan(reference_input(rate=7_732.0))
    _same_as_plan(reference_input(rate=7_732.0, quota_hours=30.0, quota_reset=T0 + timedelta(days=6),
                                  used_hours=0.447))
    _same_as_plan(reference_input(ckpt_every=0, ckpt_every_s=600.0, startup_seconds=10.7))
    _same_as_plan(reference_input(ckpt_every_s=900.0, gap_hours=0.5, bill_factor=2.0))


def test_no_trace_cut_is_the_plan_too():
    """A trace whose sessions were never cut, and a rate of zero, give the plan, whatever the seed."""
    inp = reference_input(rate=12_977.0)
    p = plan(inp)
    r = simulate(SimInput(inp, Interruptions(lifetimes_hours=[math.inf, 20.0], source="t"), runs=50, seed=7))
    assert (r.finish == p.eta.timestamp()).all() and (r.sessions == len(p.sessions)).all()


inputs = st.fixed_dictionaries({
    "total_steps": st.integers(1, 5_000), "rate": st.floats(500, 50_000), "session_hours": st.floats(0.5, 24),
    "margin_frac": st.floats(0, 0.5), "ckpt_seconds": st.floats(0, 120), "ckpt_every": st.integers(0, 800),
    "ckpt_every_s": st.sampled_from([0.0, 0.0, 300.0, 1800.0]), "startup_seconds": st.floats(0, 600),
    "quota": st.sampled_from([0.0, 0.0, 10.0, 30.0]),
})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs)
def test_uninterrupted_simulation_is_the_plan_for_any_input(d):
    inp = PlanInput(total_steps=d["total_steps"], tokens_per_step=65_536, rate=d["rate"],
                    session_hours=d["session_hours"], margin_hours=d["session_hours"] * d["margin_frac"],
                    ckpt_seconds=d["ckpt_seconds"], ckpt_every=d["ckpt_every"], ckpt_every_s=d["ckpt_every_s"],
                    startup_seconds=d["startup_seconds"], quota_hours=d["quota"], quota_reset=T0, start=T0)
    try:
        plan(inp)
    except BatonError:
        return  # an input the plan refuses is refused by the simulation too (below)
    _same_as_plan(inp, runs=2)


def test_simulate_command_equals_plan_command(baton_cli):
    args = ["--target-tokens", "1e9", "--tokens-per-step", "262144", "--rate", "9696", "--session-hours", "9h",
            "--margin", "30%", "--ckpt-seconds", "16.5", "--ckpt-every", "381", "--start", "2026-09-20T06:00Z"]
    p = json.loads(baton_cli("plan", *args, "--json", check=True).stdout)
    s = json.loads(baton_cli("simulate", *args, "--interrupt-rate", "0", "--runs", "20", "--json", check=True).stdout)
    assert s["plan"] == {"sessions": 5, "eta": p["eta"], "billed_hours": p["billed_hours"]}
    assert s["finish"] == {"p10": p["eta"], "p50": p["eta"], "p90": p["eta"]}
    assert s["sessions"]["p10"] == s["sessions"]["p90"] == 5 and s["steps_lost"]["p90"] == 0
    assert s["billed_hours"]["p50"] == p["billed_hours"]


# ------------------------------------------------------------------ 2. Poisson interruptions, closed forms


def _poisson_input(startup: float, cadence_steps: int = 600, segments: int = 100, ckpt: float = 30.0) -> PlanInput:
    """One step per second, a checkpoint every ``cadence_steps`` steps, sessions long enough that only cuts end
    them: the relay is a renewal process of segments (work, then a cycle), each redone from its start when cut."""
    return PlanInput(total_steps=cadence_steps * segments, tokens_per_step=1000, rate=1000.0, session_hours=10_000.0,
                     ckpt_seconds=ckpt, ckpt_every=cadence_steps, startup_seconds=startup, start=T0)


def test_lost_work_per_interruption_matches_the_closed_form():
    """A cut at x seconds into a segment of L = tau + C seconds loses floor(min(x, tau)) steps; given a cut in
    the segment, x is exponential truncated to [0, L], so E[lost] = sum_{k=1..tau} (e^-lk - e^-lL) / (1 - e^-lL).

    Tolerance: 4 standard errors of the mean over the N cuts simulated (the sample's own spread), plus the
    cuts of the export window at the horizon (a cut there loses nothing; about lambda x C of one per run)."""
    lam_h, tau, c = 1.0, 600, 30.0
    lam, L = lam_h / HOUR, tau + c
    r = simulate(SimInput(_poisson_input(0.0), Interruptions(rate_per_hour=lam_h), runs=1000, seed=1))
    n = int(r.interruptions.sum())
    assert n > 15_000
    got = r.steps_lost.sum() / n
    want = sum((math.exp(-lam * k) - math.exp(-lam * L)) / (1 - math.exp(-lam * L)) for k in range(1, tau + 1))
    sd = math.sqrt(tau ** 2 / 12)  # the spread of a nearly uniform loss on [0, tau]: an upper bound here
    tol = 4 * sd / math.sqrt(n) + want * r.input.runs * lam * c / n
    assert abs(got - want) <= tol, (got, want, tol)
    # Young's picture: about half a cadence is lost per cut when cuts are rare within a segment.
    assert want == pytest.approx(tau / 2, rel=0.1)


def test_billed_time_matches_the_closed_form():
    """Expected wall clock of the renewal process, start-up S cut too:
    (e^lS - 1)/l for the first start-up, (1 - e^-lL) e^l(S+L) / l per segment, (1 - e^-lC)/l for the export.
    Billed = wall clock x bill factor. Tolerance: 4 standard errors of the mean over the runs."""
    lam_h, tau, c, s, k = 1.0, 600, 30.0, 120.0, 100
    lam, L = lam_h / HOUR, tau + c
    inp = replace(_poisson_input(s, tau, k, c), bill_factor=2.0)
    r = simulate(SimInput(inp, Interruptions(rate_per_hour=lam_h), runs=1000, seed=2))
    want = (math.expm1(lam * s) + k * (1 - math.exp(-lam * L)) * math.exp(lam * (s + L)) + 1 - math.exp(-lam * c)) / lam
    got = r.wall_hours.mean() * HOUR
    tol = 4 * r.wall_hours.std(ddof=1) * HOUR / math.sqrt(r.input.runs)
    assert abs(got - want) <= tol, (got, want, tol)
    assert r.billed_hours.mean() == pytest.approx(2 * r.wall_hours.mean(), rel=1e-12)
    assert want > k * L  # cuts cost time: more than the uninterrupted run
    # Each cut starts one more session, but for a cut during the export at the horizon: the run is complete.
    extra = r.sessions - r.interruptions
    assert set(extra.tolist()) <= {0.0, 1.0} and (extra == 1).mean() > 0.95


def test_auto_cadence_is_at_the_simulated_optimum_and_at_young_daly():
    """With C = 30 s and 0.5 interruptions/h, lambda x C = 0.004: Young's sqrt(2 C / lambda) holds to first order.
    The auto cadence (the exact optimum of the closed form) is within 5 % of it and of the optimum fitted to the
    simulated overhead over half to twice the cadence (common random numbers, fixed seed)."""
    lam_h, c = 0.5, 30.0
    cad = auto_cadence(c, lam_h, "given")
    work = cad.minutes * 60 - c
    young = young_work_seconds(c, lam_h / HOUR)
    assert work == pytest.approx(optimal_work_seconds(c, lam_h / HOUR))
    assert abs(work - young) / young < 0.05
    assert cad.young_minutes == pytest.approx(young / 60) and "Young/Daly" in cad.reason
    inp = replace(_poisson_input(0.0), ckpt_every=0)
    si = SimInput(inp, Interruptions(rate_per_hour=lam_h), runs=400, seed=0)
    curve = cadence_curve(si, curve_minutes(si))
    best = curve["fitted_optimum_minutes"]
    assert abs(best - cad.minutes) / cad.minutes < 0.05, (best, cad.minutes)
    over = [pt["overhead_hours"] for pt in curve["points"]]
    assert over[0] > min(over) < over[-1]  # a real minimum inside the range, not at its edge


def test_exact_optimum_approaches_young_when_cuts_are_rare():
    for lam_c in (1e-2, 1e-3, 1e-5):
        lam = lam_c / 30.0
        ratio = optimal_work_seconds(30.0, lam) / young_work_seconds(30.0, lam)
        assert 1 - 0.9 * math.sqrt(lam_c) < ratio < 1  # second order: 1 - sqrt(2 lam C) / 3 + ...


@settings(max_examples=200, deadline=None)
@given(step=st.floats(0.05, 60), cycle=st.floats(0, 120), tau=st.floats(1, 3_600), n=st.integers(1, 400),
       every=st.integers(0, 50), a=st.integers(0, 100))
def test_cadence_points_are_what_the_session_clock_does(step, cycle, tau, n, every, a):
    """The planner's timed checkpoints fall where the session's own clock (TimeBudget) and the step cadence put
    them, on a timeline of exact step and cycle times: the clock starts at the first step and restarts at each
    checkpoint's start (session.core, loop.run)."""
    inp = PlanInput(total_steps=a + n + 1, tokens_per_step=1, rate=1 / step, session_hours=1e6, ckpt_seconds=cycle,
                    ckpt_every=every, ckpt_every_s=tau)
    budget = TimeBudget(None, 0.0, cycle, tau, start=0.0)
    now, seen = 0.0, []
    for m in range(1, n):
        now += step
        assume(abs(now - budget.last_ckpt - tau) > 1e-6 * tau)  # not on the boundary itself, where rounding decides
        if budget.checkpoint_due(now) or (every and (a + m) % every == 0):
            seen.append(a + m)
            budget.observe_checkpoint(cycle, at=now)
            now += cycle
    assert cadence_points(inp, a, a + n) == seen


def test_a_timed_cadence_is_counted_in_session_time_and_capacity():
    inp = reference_input(ckpt_every=0, ckpt_every_s=600.0)
    pts = cadence_points(inp, 0, 762)
    assert pts[0] == math.ceil(600 / inp.step_seconds) and len(pts) == len(set(pts))
    assert session_seconds(inp, 0, 762) == pytest.approx(762 * inp.step_seconds + (len(pts) + 1) * 16.5)
    cap = capacity(inp, 0)
    assert session_seconds(inp, 0, cap) <= inp.usable_seconds < session_seconds(inp, 0, cap + 1)


# -------------------------------------------------------------------------------- outages and traces


def test_outages_within_the_retries_delay_and_beyond_them_fail_the_push():
    base = reference_input(ckpt_every=60)
    irq = Interruptions()
    short = simulate(SimInput(base, irq, Outages(rate_per_hour=2.0, minutes=2.0, retry_seconds=300), runs=200))
    assert short.outage_failures.sum() == 0 and short.steps_lost.sum() == 0
    assert short.wall_hours.mean() > plan(base).wall_hours  # waiting out outages costs time
    long = simulate(SimInput(base, irq, Outages(rate_per_hour=2.0, minutes=30.0, retry_seconds=300), runs=200))
    assert long.outage_failures.sum() > 0 and long.steps_lost.sum() > 0
    assert long.wall_hours.mean() > short.wall_hours.mean()


def test_ledger_observations_and_the_trace():
    now = 1_800_000_000.0

    def rec(start, hours, outcome):
        end = start + hours * HOUR
        return LedgerRecord(session=f"s{start}", run="r", started_ts=start, heartbeat_ts=end, steps_from=0,
                            ended_ts=None if outcome == "open" else end, outcome=outcome, heartbeat_every_s=600.0)

    records = [rec(now - 50 * HOUR, 9.0, "ended"), rec(now - 40 * HOUR, 2.0, "open"), rec(now - 30 * HOUR, 1.0, "open"),
               LedgerRecord(session="pf", run="r", started_ts=now - 60 * HOUR, kind="preflight:resume"),
               rec(now - 0.1 * HOUR, 0.05, "open")]  # the last one is still running: not a cut
    seen = observe(records, now)
    assert (seen.interruptions, seen.sessions) == (2, 4) and seen.hours == pytest.approx(12.05)
    rate, why = seen.rate_per_hour(9.0)
    assert rate == pytest.approx(2 / 12.05) and why.startswith("2 interruption(s) in 12.05 h of 4 session(s)")
    none = observe(records[:1], now)
    assert none.rate_per_hour(9.0)[0] == pytest.approx(1 / 18.0)  # as if the next session were cut
    cad = resolve_cadence("auto", records, 16.5, 9.0, 6.3, now=now)
    assert cad.auto and cad.minutes == pytest.approx((optimal_work_seconds(16.5, rate / HOUR) + 16.5) / 60)
    assert resolve_cadence(12.0, records, 16.5, 9.0).minutes == 12.0
    assert resolve_cadence("auto", records, None, 9.0, now=now).minutes == 0.0  # no cycle measured yet


def test_same_seed_same_numbers_other_seed_other_numbers():
    si = SimInput(reference_input(), Interruptions(rate_per_hour=0.3), runs=300, seed=5)
    a, b = simulate(si), simulate(si)
    assert (a.finish == b.finish).all() and (a.steps_lost == b.steps_lost).all()
    c = simulate(replace(si, seed=6))
    assert not (a.finish == c.finish).all()
    d = a.to_dict()
    assert d["finish"]["p10"] <= d["finish"]["p50"] <= d["finish"]["p90"]
    assert d["billed_hours"]["p10"] >= plan(si.plan).billed_hours - 1e-9


def test_deadline_and_cap_probabilities():
    base = reference_input()
    p = plan(base)
    si = SimInput(replace(base, deadline=p.eta + timedelta(hours=12), cap_left_hours=p.billed_hours + 5),
                  Interruptions(rate_per_hour=0.2), runs=400)
    r = simulate(si)
    assert r.p_deadline() == pytest.approx(np.mean(r.finish <= si.plan.deadline.timestamp()))
    assert 0 < r.p_deadline() < 1 and 0 < r.p_cap() < 1


# ------------------------------------------------------------------------------ 4. bad inputs, one line


@pytest.fixture
def cli_base(tmp_path):
    return ["simulate", "--steps", "3814", "--tokens-per-step", "262144", "--rate", "9696", "--session-hours", "9",
            "--margin", "30%", "--ckpt-seconds", "16.5", "--start", "2026-09-20T06:00Z", "--runs", "20"]


def _one_line_error(p, *parts):
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("baton: error: "), p.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_bad_inputs_are_one_line_errors(baton_cli, cli_base, tmp_path):
    garbage = tmp_path / "garbage.txt"
    garbage.write_bytes(bytes(range(256)) * 8)
    words = tmp_path / "words.txt"
    words.write_text("9h\n5h30m\n# a comment\nsoon\n")
    zero = tmp_path / "zero.txt"
    zero.write_text("0\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    for extra, parts in [
        (["--interrupt-rate", "-0.5"], ("--interrupt-rate", "must be >= 0")),
        (["--interrupt-rate", "nan"], ("--interrupt-rate", "not a finite number")),
        (["--outage-rate", "-1"], ("--outage-rate", "must be >= 0")),
        (["--outage-rate", "1"], ("store outages need a length: --outage-minutes",)),
        (["--trace", str(garbage)], ("--trace file", "could not be read", "one per line")),
        (["--trace", str(words)], (f"--trace {words}: line 4: 'soon' is not a session lifetime",)),
        (["--trace", str(zero)], ("line 1: '0' is not a session lifetime > 0",)),
        (["--trace", str(empty)], ("holds no session lifetimes",)),
        (["--trace", str(tmp_path / "missing.txt")], ("--trace", "not found")),
        (["--trace", str(words), "--interrupt-rate", "1"], ("--interrupt-rate or --trace, not both",)),
        (["--deadline", "2026-09-21T00:00Z"], ("before the relay could finish even without interruptions",
                                              "give a later --deadline")),
        (["--deadline", "2026-09-19T00:00Z"], ("is not after the start",)),
        (["--interrupt-rate", "50", "--runs", "3"], ("does not finish within", "checkpoint more often")),
        (["--ckpt-minutes", "soon"], ("--ckpt-minutes 'soon' is neither",)),
        (["--runs", "0"], ("--runs", "between 1 and")),
    ]:
        _one_line_error(baton_cli(*cli_base, *extra), *parts)


def test_auto_cadence_in_the_config_is_validated_and_printed(baton_cli, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[run]\nname = "sim"\nlocal_dir = "{tmp_path / "runs"}"\n[store]\nurl = "{tmp_path / "store"}"\n'
                   '[budget]\nckpt_minutes = "auto"\nckpt_seconds = 16.5\nsession_hours = 9\n')
    out = baton_cli("plan", "-c", str(cfg), "--rate", "9696", "--steps", "3814", "--tokens-per-step", "262144",
                    check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("checkpoint cadence: auto: "))
    assert "Young/Daly" in line and "as if the next session were cut" in line
    sim = json.loads(baton_cli("simulate", "-c", str(cfg), "--rate", "9696", "--steps", "3814", "--tokens-per-step",
                               "262144", "--interrupt-rate", "0.5", "--runs", "50", "--json", check=True).stdout)
    want = auto_cadence(16.5, 0.5, "x").minutes
    assert sim["ckpt_minutes"] == pytest.approx(want, abs=1e-4) and "at 0.5 interruptions/h" in sim["sources"]["cadence"]
    bad = baton_cli("plan", "-c", str(cfg), "--set", "budget.ckpt_minutes=soon", "--rate", "1")
    _one_line_error(bad, "budget.ckpt_minutes='soon' is neither a number nor auto")


def test_the_python_api():
    import baton

    base = dict(steps="3814", tokens_per_step="262144", rate="9696", session_hours="9", margin="30%",
                ckpt_seconds=16.5, ckpt_every=381, start="2026-09-20T06:00Z")
    out = baton.simulate(**base, interrupt_rate=0.2, runs=200, curve=True, deadline="2026-09-23T00:00Z")
    assert out["plan"]["sessions"] == 5 and out["runs"] == 200 and 0 < out["p_deadline"] <= 1
    assert "| finish |" in out["text"] and out["curve"]["fitted_optimum_minutes"] > 0
    assert baton.simulate(**base, interrupt_rate=0, runs=5)["finish"]["p50"] == baton.plan(**base)["eta"]
    with pytest.raises(BatonError, match="simulate: no option bogus"):
        baton.simulate(bogus=1)
    with pytest.raises(BatonError, match="interrupt_rate=-1: must be >= 0"):
        baton.simulate(**base, interrupt_rate=-1)


@pytest.mark.parametrize("rate", ["9696", "9701", "12345"])
def test_a_deadline_at_the_eta_plan_prints_is_met(rate, baton_cli):
    """The printed ETA is to the minute (rounded up): as --deadline, plan does not warn, simulate does not
    refuse it, and an uninterrupted relay meets it."""
    import baton

    base = dict(steps="3814", tokens_per_step="262144", rate=rate, session_hours="9", margin="30%",
                ckpt_seconds=16.5, ckpt_every=381, start="2026-09-20T06:00Z")
    eta = baton.plan(**base)["eta"]
    assert not [w for w in baton.plan(**base, deadline=eta)["warnings"] if "deadline" in w]
    assert baton.simulate(**base, deadline=eta, interrupt_rate=0, runs=3)["p_deadline"] == 1.0
    if rate == "9696":  # the commands too
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in base.items()]
        printed = baton_cli("plan", *flags, check=True).stdout.strip().splitlines()
        shown = next(ln for ln in printed if "; ETA " in ln).rsplit("; ETA ", 1)[1]
        assert shown == eta
        baton_cli("simulate", *flags, "--deadline", shown, "--interrupt-rate", "0", "--runs", "3", check=True)
