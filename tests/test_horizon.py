"""Moving the horizon on resume: allowed (with --allow-change train.steps) while the wsd schedule is on its
plateau, where the extended run is the run that had the longer horizon from the start; refused once the
cooldown has begun."""

from __future__ import annotations

import pytest

from baton.cli import main
from baton.config import load_config
from baton.loop import run
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors

# warmup 5, decay from 80 % of the horizon: step 60 is on the plateau of a 100- and a 150-step run (decay at
# 80 and 120); step 86 is inside the 100-step run's cooldown.
SCHEDULE = ["optim.warmup_steps=5", "optim.decay_start=0.8", "train.log_every=50"]


def _trace(run_dir):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["batch_sha"]) for r in read_metrics(run_dir)]


def test_extending_a_wsd_run_on_its_plateau_equals_the_longer_run(make_config, tmp_path, capsys):
    cfg = str(make_config())
    store, runs = tmp_path / "store", tmp_path / "runs"

    def config(name: str, steps: int):
        return load_config(cfg, [*SCHEDULE, f"run.name={name}", f"train.steps={steps}"])

    run(config("long", 150), progress=False)
    run(config("ext", 100), stop_after=60, progress=False)

    # Without the flag the new horizon is named, with the flag that would let it through.
    assert main(["train", "-c", cfg, *[a for s in SCHEDULE for a in ("--set", s)], "--set", "run.name=ext",
                 "--set", "train.steps=150", "--no-progress"]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("baton: error:")]
    assert "train.steps: checkpoint 100, now 150" in err and "pass --allow-change for train.steps" in err

    run(config("ext", 150), progress=False, allow_change=("train.steps",))
    assert _trace(runs / "ext") == _trace(runs / "long")  # step for step: loss, lr, gradient norm, batch
    model_a, optim_a, pa = store_checkpoint_tensors(store, "long")
    model_b, optim_b, pb = store_checkpoint_tensors(store, "ext")
    assert pa["step"] == pb["step"] == 150 and pa["complete"] and pb["complete"]
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)


def test_extending_inside_the_cooldown_is_refused(make_config, tmp_path, capsys):
    cfg = str(make_config())
    run(load_config(cfg, [*SCHEDULE, "train.steps=100"]), stop_after=86, progress=False)
    capsys.readouterr()
    rc = main(["train", "-c", cfg, *[a for s in SCHEDULE for a in ("--set", s)], "--set", "train.steps=150",
               "--allow-change", "train.steps", "--no-progress"])
    assert rc == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("baton: error:")]
    assert errors == [("baton: error: refusing to move the horizon from 100 to 150 steps: the checkpoint at step 86 "
                       "is past the decay start of the 100-step schedule (step 80): its cooldown has begun, and a "
                       "new horizon cannot move it (resume with train.steps = 100, or start a new run.name)")]
    assert store_checkpoint_tensors(tmp_path / "store", "test")[2]["step"] == 86  # nothing moved


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_a_schedule_that_decays_from_the_warmup_cannot_be_extended_after_it(schedule):
    from baton.checkpoint.record import CheckpointState
    from baton.session.drift import horizon_problem

    old = load_config(None, [f"optim.schedule={schedule}", "optim.warmup_steps=5", "train.steps=100"]).to_dict()
    new = load_config(None, [f"optim.schedule={schedule}", "optim.warmup_steps=5", "train.steps=150"]).to_dict()
    def state(step: int) -> CheckpointState:
        return CheckpointState(step=step, total_steps=100, cursor={}, config=old, rng_ranks=[{}],
                               optimizer_param_groups=[])

    assert horizon_problem(state(5), new, 150) is None
    why = horizon_problem(state(6), new, 150)
    assert why and f"the {schedule} schedule decays from the end of the warmup" in why
