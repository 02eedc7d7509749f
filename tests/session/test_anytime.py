"""Anytime mode (budget.anytime): a run whose quota is cut ends annealed inside it, the shortening logged in one line,
booked in the ledger and kept in the checkpoint; a quota that comes back once the cooldown began lengthens nothing;
bad settings are refused at config load.

The forecast reads the ledger through ``baton.session.anytime.books``; these tests give it the planner's clock
(``support.planner_clock``): the relay's own sessions, billed as the planner accounts them at a fixed rate, so the
verdicts depend on the steps trained, never on this machine's speed, and nothing waits."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest

from baton.checkpoint.record import CheckpointState
from baton.cli import main
from baton.config import load_config
from baton.errors import ConfigError
from baton.loop import run
from baton.model.schedule import decay_begin
from baton.planning.anytime import Verdict
from baton.planning.ledger import LedgerRecord, read_ledger
from baton.planning.plan import PlanInput, plan
from baton.session import anytime
from baton.session.anytime import choose, first_horizon
from baton.session.drift import horizon_problem
from baton.store import open_store
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors
from support.markov_corpus import markov_corpus
from support.planner_clock import SimulatedBooks

PLANNED = 120  # steps
STEP_S, STARTUP_S, CKPT_S, EVERY = 36.0, 60.0, 30.0, 4  # the planner's accounting: 0.01 h a step
TOKENS_PER_STEP = 8 * 32
# A learning rate that leaves the Markov corpus's plateau well above what a cooldown reaches.
SETTINGS = [f"train.steps={PLANNED}", "optim.lr=3e-2", f"train.ckpt_every={EVERY}", "train.log_every=1000",
            "budget.session_hours=1", f"budget.ckpt_seconds={CKPT_S}", f"budget.startup_minutes={STARTUP_S / 60}",
            "budget.bill_factor=1"]


def _plan_hours(steps: int) -> float:
    """What the planner bills for the whole run to ``steps``, sessions of an hour from step 0."""
    return plan(PlanInput(total_steps=steps, tokens_per_step=TOKENS_PER_STEP, rate=TOKENS_PER_STEP / STEP_S,
                          session_hours=1, margin_hours=5 / 60, startup_seconds=STARTUP_S, ckpt_seconds=CKPT_S,
                          ckpt_every=EVERY)).billed_hours


def _trace(run_dir):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["batch_sha"]) for r in read_metrics(run_dir)]


def _anytime_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("anytime:")]


def test_a_run_whose_quota_is_cut_to_60_percent_ends_annealed_inside_it(make_config, prepared_data, tmp_path,
                                                                       monkeypatch, capsys):
    corpus = markov_corpus(prepared_data, tmp_path / "markov")
    cfg_path = str(make_config())
    store, runs = tmp_path / "store", tmp_path / "runs"
    cap = round(0.6 * _plan_hours(PLANNED), 4)  # the quota: 60 % of what the plan bills
    books = SimulatedBooks(STEP_S, TOKENS_PER_STEP, STARTUP_S, CKPT_S, EVERY)
    monkeypatch.setattr(anytime, "books", books)

    def config(name: str, *more: str):
        return load_config(cfg_path, [f"data.dir={corpus}", *SETTINGS, f"run.name={name}", *more])

    run(config("any", "budget.anytime=true", f"budget.cap_hours={cap}"), stop_after=40, progress=False)
    capsys.readouterr()
    run(config("any", "budget.anytime=true", f"budget.cap_hours={cap}"), stop_after=60, progress=False)
    # The shortening: one line with the numbers (after the one that said the plateau could still go on).
    waited, line = _anytime_lines(capsys.readouterr().err)
    assert "the plateau goes on: a cooldown from step" in waited and "still fits" in waited
    assert f"horizon no longer fits budget.cap_hours = {cap:g} at P90" in line and "horizon shortened to" in line
    records = read_ledger(open_store(str(store)), "any")[0]
    (event,) = records[1].anytime
    k, horizon = event.step, event.horizon_to
    d = decay_begin(horizon, 0.8)
    assert event.action == "shortened" and event.horizon_from == event.planned == PLANNED and event.line == line
    assert re.fullmatch(re.escape(f"anytime: at step {k} the {PLANNED}-step horizon no longer fits budget.cap_hours = "
                                  f"{cap:g} at P90 (P90 ") + r"[0-9.]+ h billed of [0-9.]+" + re.escape(
        f" h the cap leaves); horizon shortened to {horizon} steps, its cooldown from step {d} to {horizon} (the last "
        f"20% of it), which fits (P90 {event.billed_hours:.3g} h billed of {event.hours_left:.3g} h the cap leaves)"),
        line)
    assert event.billed_hours <= event.hours_left and event.confidence == 0.9
    # The cooldown starts at the decision, or before the next one (checkpoints every 4 steps), and has begun
    # by the end of the second session: the run the rule (session.drift) lets a horizon move on.
    assert k <= d < k + EVERY and d < 60 < horizon < PLANNED
    state = CheckpointState.from_json(json.loads((store / "any" / "ckpt" / "step-60" / "state.json").read_text()),
                                      "state.json")
    assert (state.total_steps, state.shortened.planned, state.shortened.horizon, state.shortened.step) == \
        (horizon, PLANNED, horizon, k)

    # The quota comes back (the cap raised) after the cooldown began: one line says what it would have done; the
    # run still ends at the shortened horizon.
    run(config("any", "budget.anytime=true", "budget.cap_hours=100"), progress=False)
    (again,) = _anytime_lines(capsys.readouterr().err)
    pointer = json.loads((store / "any" / "latest.json").read_text())
    assert pointer["complete"] and pointer["step"] == horizon
    records = read_ledger(open_store(str(store)), "any")[0]
    (said,) = records[2].anytime
    assert (said.action, said.horizon_from, said.horizon_to, records[2].outcome) == \
        ("would lengthen", horizon, horizon, "completed")
    assert again == said.line == (
        f"anytime: at step 60 the planned {PLANNED}-step horizon fits budget.cap_hours = 100 at P90 again (P90 "
        f"{said.billed_hours:.3g} h billed of {said.hours_left:.3g} h the cap leaves); it would have trained to "
        f"{PLANNED} steps, but the run was shortened to {horizon}, its cooldown from step {d}: the horizon stays "
        f"{horizon} steps (a shortened run never lengthens)")
    # Inside the quota: the steps trained, billed as the forecast accounts them, fit the original cap.
    assert books.billed_hours(records, horizon) <= cap

    # Annealed: below the same run's plateau model at the same step.
    run(config("plateau", f"train.eval_every={horizon}", "train.ckpt_every=0"), stop_after=horizon, progress=False)
    (plateau,) = [r["val_loss"] for r in read_metrics(runs / "plateau") if r["step"] == horizon]
    assert pointer["val_loss"] < plateau
    # Exact: step for step the run that had the shorter horizon from the start (its steps, losses, learning
    # rates and final weights).
    run(config("short", f"train.steps={horizon}", "train.ckpt_every=0"), progress=False)
    assert _trace(runs / "any") == _trace(runs / "short")
    model_a, optim_a, _ = store_checkpoint_tensors(store, "any")
    model_b, optim_b, _ = store_checkpoint_tensors(store, "short")
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)

    # The report: the shortening's line, the horizon, and the predicted finish beside the actual one.
    capsys.readouterr()
    cfg_any = tmp_path / "any.json"
    cfg_any.write_text(json.dumps(config("any", "budget.anytime=true", f"budget.cap_hours={cap}").to_dict()))
    assert main(["status", "-c", str(cfg_any)]) == 0
    assert (f"horizon: {horizon} steps, shortened from the planned {PLANNED} by anytime mode at step {k} "
            "(docs/anytime-mode.md)") in capsys.readouterr().out.splitlines()
    assert main(["report", "-c", str(cfg_any), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert (f"- progress: step {horizon} of {horizon} ({horizon * TOKENS_PER_STEP:,} of {horizon * TOKENS_PER_STEP:,} "
            f"tokens), run complete; the horizon was shortened from the planned {PLANNED} steps by anytime mode at "
            f"step {k}") in md
    assert f"| 2 | {k} | shortened | {PLANNED} → {horizon} | {line} |" in md
    assert f"| 3 | 60 | would lengthen | {horizon} → {horizon} | {again} |" in md
    first = records[0].forecast
    assert first is not None and (first.step, first.horizon) == (0, PLANNED)
    assert (f"- predicted (session 1's start, step 0 of {PLANNED}): plan ETA {first.plan_eta}, P50 {first.p50}, "
            f"P90 {first.p90}") in md
    assert f"- actual: finished {records[2].ended} at step {horizon} (session {records[2].session})" in md


def _verdicts(limit: int, calls: list[int] | None = None):
    """A forecast in which a horizon fits when it is at most ``limit`` steps."""
    at = datetime(2026, 1, 5, tzinfo=timezone.utc)

    def verdict(t: int) -> Verdict:
        if calls is not None:
            calls.append(t)
        return Verdict(t, billed_hours=t / 100, finish=at, hours_left=limit / 100, finish_by=None, confidence=0.9)

    return verdict


def test_the_choice_keeps_defers_shortens_and_never_lengthens():
    # 100 steps planned, cooldown from step 80; a decision at step 40, the next one at 44.
    assert choose(40, 100, 100, 0.8, 44, _verdicts(100)).action == "keep"
    # 100 steps do not fit, but a cooldown begun at the next decision (horizon 55, decay from 44) still does.
    c = choose(40, 100, 100, 0.8, 44, _verdicts(60))
    assert (c.action, c.horizon, c.next_step, c.verdicts[-1].horizon) == ("defer", 100, 44, 55)
    # Neither: the longest horizon whose cooldown begins from now to before the next decision (50..54), that fits.
    c = choose(40, 100, 100, 0.8, 44, _verdicts(52))
    assert (c.action, c.horizon, decay_begin(52, 0.8)) == ("shortened", 52, 41)
    # Nothing fits: the shortest, its cooldown from now.
    c = choose(40, 100, 100, 0.8, 44, _verdicts(10))
    assert (c.action, c.horizon, decay_begin(50, 0.8)) == ("shortened", 50, 40)
    # The cooldown of the horizon has begun: nothing to shorten.
    assert choose(85, 100, 100, 0.8, 88, _verdicts(90)).action == "too late"
    # Shortened to 52 before; the planned 100 steps fit again: it says so, and keeps 52.
    c = choose(44, 52, 100, 0.8, 48, _verdicts(200))
    assert (c.action, c.horizon, c.verdicts[-1].horizon) == ("would lengthen", 52, 100)
    # The rule a resume obeys when the horizon moves (session.drift) allows every shortening made.
    state = CheckpointState(step=40, total_steps=100, cursor={}, config=load_config(None, ["train.steps=100"]).to_dict(),
                            rng_ranks=[{}], optimizer_param_groups=[])
    for limit in (52, 10):
        c = choose(40, 100, 100, 0.8, 44, _verdicts(limit))
        assert horizon_problem(state, load_config(None, [f"train.steps={c.horizon}"]).to_dict(), c.horizon) is None


@pytest.mark.parametrize("decay_start", [0.8, 0.9, 0.29, 0.7, 0.5])
def test_the_first_horizon_whose_cooldown_starts_at_a_step(decay_start):
    for k in range(0, 400):
        t = first_horizon(k, decay_start)
        assert t > k and decay_begin(t, decay_start) >= k
        assert t == k + 1 or decay_begin(t - 1, decay_start) < k


@pytest.mark.parametrize("settings, line", [
    (["budget.anytime=true", "budget.session_hours=9"],
     "invalid config: budget.anytime needs an end to forecast against: set budget.cap_hours (the billed hours the "
     "run may use) or budget.finish_by (when it must be complete), or budget.anytime = false"),
    (["budget.anytime=true", "budget.session_hours=9", "budget.cap_hours=30", "optim.schedule=cosine"],
     "invalid config: budget.anytime moves the start of a wsd cooldown, but optim.schedule is 'cosine' (it decays "
     "from the warmup's end, so a shorter horizon would change updates already made): set optim.schedule = \"wsd\", "
     "or budget.anytime = false"),
    (["budget.anytime=true", "budget.session_hours=9", "budget.finish_by=2026-10-01T00:00Z",
      "budget.anytime_confidence=1"],
     "invalid config: budget.anytime_confidence must be in (0, 1), got 1.0"),
    (["budget.anytime=true", "budget.cap_hours=30"],
     "invalid config: budget.anytime forecasts the relay's sessions: set budget.session_hours (the platform's session "
     "limit), or budget.anytime = false"),
    # A cooldown fixed at a step: a shortened horizon would end at the peak, or cut a cooldown under way.
    (["budget.anytime=true", "budget.session_hours=9", "budget.cap_hours=30", "train.steps=120",
      "optim.decay_step=96"],
     "invalid config: budget.anytime moves the cooldown's start with the horizon, but optim.decay_step=96 fixes it: "
     "set optim.decay_step = 0 (decay_start of the horizon), or budget.anytime = false"),
])
def test_bad_anytime_settings_are_refused_at_config_load_in_one_line(settings, line, capsys):
    with pytest.raises(ConfigError) as e:
        load_config(None, settings)
    assert str(e.value) == line
    assert main(["config", *[a for s in settings for a in ("--set", s)]]) == 2
    assert capsys.readouterr().err.splitlines() == [f"baton: error: {line}"]


def test_the_records_keep_a_shortening_and_the_decisions():
    from pathlib import Path

    assets = Path(__file__).resolve().parents[1] / "assets" / "records"
    raw = json.loads((assets / "state-v1.json").read_text())
    cut = {**raw, "total_steps": 10, "step": 8, "shortened": {"planned": 20, "horizon": 10, "step": 7, "line": "x"}}
    state = CheckpointState.from_json(cut, "s")
    assert state.shortened is not None and state.horizon(20) == 10 and state.horizon(30) == 30
    assert state.to_json() == {k: v for k, v in cut.items() if k != "scheduler"}
    from baton.errors import ResumeError

    for bad in ({"planned": 20, "horizon": 25, "step": 7}, {"planned": 20, "horizon": 12, "step": 7}):
        with pytest.raises(ResumeError) as e:
            CheckpointState.from_json({**cut, "shortened": bad}, "s")
        assert "shortened is not a shortened horizon" in str(e.value) and "\n" not in str(e.value)
    led = json.loads((assets / "ledger-v1.json").read_text())
    event = {"step": 7, "action": "shortened", "horizon_from": 20, "horizon_to": 10, "planned": 20, "confidence": 0.9,
             "billed_hours": 0.5, "hours_left": 0.6, "finish": "2026-01-05T01:00Z", "finish_by": None, "line": "x",
             "at": "2026-01-05T00:00Z"}
    forecast = {"step": 0, "horizon": 20, "at": "2026-01-05T00:00Z", "plan_eta": "2026-01-05T01:00Z",
                "p50": "2026-01-05T01:10Z", "p90": "2026-01-05T01:30Z", "billed_hours_p50": 1.1, "billed_hours_p90": 1.4}
    rec = LedgerRecord.from_json({**led, "anytime": [event], "forecast": forecast})
    assert rec.to_json()["anytime"] == [event] and rec.to_json()["forecast"] == forecast
    for bad in ({**event, "action": "lengthened"}, {**event, "horizon_to": "10"}, {**event, "billed_hours": "x"}):
        with pytest.raises(ValueError):
            LedgerRecord.from_json({**led, "anytime": [bad]})


def test_anytime_without_a_checkpoint_cadence_says_the_first_session_cannot_anneal_in_time(make_config, capsys):
    """Anytime mode decides at a session's start and before each checkpoint. A first session has no measured rate
    at its start; with no cadence its next decision is its own end, so a quota ending inside it would end on the
    plateau: said at the start, with the setting that fixes it."""
    said = []
    for cadence in ([], ["budget.ckpt_minutes=30"], ["train.ckpt_every=2"]):
        cfg = load_config(make_config(), ["train.steps=4", "budget.anytime=true", "budget.cap_hours=1",
                                          "budget.session_hours=1", f"run.name=c{len(said)}", *cadence])
        run(cfg, stop_after=2, progress=False)
        said.append(_anytime_lines(capsys.readouterr().err))
    assert said[0][0].startswith("anytime: no forecast at step 0 yet")
    assert said[0][1] == ("anytime: no checkpoint cadence (train.ckpt_every = 0, budget.ckpt_minutes = 0), so the "
                          "next decision comes at this session's end, too late to anneal within it should the quota "
                          "end first: set budget.ckpt_minutes (\"auto\" chooses it) or train.ckpt_every")
    assert [len(lines) for lines in said] == [2, 1, 1]
