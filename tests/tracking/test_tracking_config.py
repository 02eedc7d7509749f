"""The [log] section and the new train keys validate like every other key; the budget counts evaluations."""

from __future__ import annotations

import pytest

from baton.config import load_config
from baton.errors import ConfigError
from baton.session.clock import TimeBudget


@pytest.mark.parametrize("override, message", [
    ('log.backends=["jsonl","neptune"]', "log.backends: 'neptune' is not one of jsonl, tensorboard, wandb, mlflow"),
    ('log.backends=["wandb","wandb"]', "log.backends lists a backend twice"),
    ("log.mlflow_uri=https://u:p@mlflow.invalid", "log.mlflow_uri must not carry credentials"),
    ("train.eval_every=-1", "train.eval_every must be >= 0"),
    ("train.eval_every=3 data.val_windows=0", "train.eval_every=3 needs held-out windows: set data.val_windows > 0"),
    ("train.spike_threshold=-2", "train.spike_threshold must be > 0"),
])
def test_bad_log_and_eval_keys_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, override.split())


def test_budget_keeps_time_for_the_next_evaluation():
    b = TimeBudget(deadline=100.0, margin_s=10.0, ckpt_guess_s=20.0, eval_steps=1.0)
    b.observe_step(5.0)
    assert b.needed(final=False) == 5 + 20 + 10
    assert b.needed(final=False, evaluates=True) == 5 + 5 + 20 + 10  # guessed from the step time until measured
    b.observe_eval(30.0)
    assert b.needed(final=False, evaluates=True) == 5 + 30 + 20 + 10
    assert b.needed(final=True) == 5 + 20 + (20 + 30) + 10  # the horizon's evaluation: as measured
    assert not b.should_stop(now=40.0) and b.should_stop(now=40.0, evaluates=True)


def test_a_tracker_that_cannot_start_is_one_line_before_any_step(make_config, tmp_path, monkeypatch):
    """MLflow 3 refuses a file: store unless MLFLOW_ALLOW_FILE_STORE is set: a real start failure, said as one
    line naming the tracker and what to check, with no step trained."""
    import baton
    from baton.errors import BatonError

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    cfg = baton.load_config(make_config(), ['log.backends=["jsonl","mlflow"]',
                                            f"log.mlflow_uri={(tmp_path / 'mlruns').as_uri()}"])
    with pytest.raises(BatonError) as e:
        baton.train(cfg, progress=False)
    said = str(e.value)
    assert said.startswith("tracker mlflow could not start (MlflowException: ") and "\n" not in said
    assert said.endswith("or remove 'mlflow' from log.backends") and "log.mlflow_uri" in said
    assert not (cfg.run_dir / "metrics.jsonl").exists()


def test_a_tracker_url_with_credentials_from_the_environment_is_never_kept_or_shown(make_config, baton_cli, tmp_path):
    """The config refuses a password in log.mlflow_uri; MLflow's own variable can still carry one, and MLflow's
    error quotes the URL it was given. Neither the terminal, the run's log, nor the store's ledger (and so no
    report) holds the secret."""
    cfg = make_config()
    env = {"MLFLOW_TRACKING_URI": "http://alice:S3cretPw@127.0.0.1:9/", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    r = baton_cli("train", "-c", str(cfg), "--set", 'log.backends=["jsonl","mlflow"]', "--no-progress", env=env)
    assert r.returncode == 2 and "tracker mlflow could not start" in r.stderr, r.stderr
    assert "S3cretPw" not in r.stdout + r.stderr and "http://…@127.0.0.1:9" in r.stderr
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or b"S3cretPw" not in f.read_bytes(), f
    assert list((tmp_path / "store" / "test" / "ledger").glob("*.json"))  # the failed session is billed, scrubbed
