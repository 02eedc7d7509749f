"""Drift on resume: a resume that would silently become another run is refused with every difference in
one message; legitimate changes pass; deliberate ones pass with --allow-change KEY."""

from __future__ import annotations

import json

import pytest

from baton.errors import BatonError
from baton.session.drift import ALLOWABLE, validate_allowed


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("baton: error:")]


@pytest.fixture
def resumable(zygote, make_config, tmp_path):
    """(train(*args), store): a run stopped at step 4 with a verified checkpoint."""
    cfg = make_config()

    def train(*args: str, timeout: float = 120):
        return zygote.run(["train", "-c", cfg, "--no-progress", *args], tmp_path / "out", timeout=timeout)

    first = train("--stop-after-steps", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    return train, tmp_path / "store"


def _pointer(store) -> dict:
    return json.loads((store / "test" / "latest.json").read_text())


def test_every_difference_in_one_message(resumable, zygote, make_config, tmp_path):
    train, store = resumable
    # Other data: the same sources under a different tokenizer, so the tokens and the fingerprint differ.
    other = tmp_path / "other-corpus"
    prep = zygote.run(["prepare", "-c", make_config("other.toml"), "--set", f"data.dir={other}",
                       "--set", "data.tokenizer_vocab=400", "--no-progress"], tmp_path / "out")
    assert prep.returncode == 0, prep.stderr[-2000:]
    before = _pointer(store)

    r = train("--set", "model.n_layers=3", "--set", "data.seq_len=16", "--set", "data.shuffle_seed=8",
              "--set", "train.global_batch=12", "--set", f"data.dir={other}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    errors = _error_lines(r.stderr)
    assert len(errors) == 1, r.stderr
    msg = errors[0]
    old_tok = json.loads((store / "test" / before["path"] / "state.json").read_text())["data"]["tokenizer_sha256"]
    new_manifest = json.loads((other / "manifest.json").read_text())
    for part in ("model.n_layers: checkpoint 2, now 3", "data.seq_len: checkpoint 32, now 16",
                 "data.shuffle_seed: checkpoint 7, now 8", "train.global_batch: checkpoint 8, now 12",
                 "tokens per step: checkpoint 256, now 192",
                 f"data.fingerprint: checkpoint '{before['cursor']['dataset_fingerprint']}', "
                 f"now '{new_manifest['fingerprint']}'",
                 f"data.tokenizer: checkpoint sha256 {old_tok[:12]}…, "
                 f"now sha256 {new_manifest['tokenizer']['sha256'][:12]}…"):
        assert part in msg, f"{part!r} missing from: {msg}"
    assert "--allow-change for data.shuffle_seed, data.fingerprint, data.tokenizer" in msg
    assert _pointer(store) == before  # a refused resume touches nothing in the store

    # The same new data on purpose: allowed by name, and the cursor now names the new corpus.
    r = train("--set", f"data.dir={other}", "--allow-change", "data.fingerprint", "--allow-change", "data.tokenizer",
              "--stop-after-steps", "5")
    assert r.returncode == 0, r.stderr[-3000:]
    p = _pointer(store)
    assert p["step"] == 5 and p["cursor"]["dataset_fingerprint"] == new_manifest["fingerprint"]


def test_legitimate_changes_pass_and_are_logged(resumable):
    train, store = resumable
    # A new horizon moves the schedule's decay: on purpose only (--allow-change), and only on the plateau.
    r = train("--set", "train.steps=24", "--set", "optim.lr=1e-3", "--set", "train.micro_batch=2",
              "--allow-change", "train.steps", "--stop-after-steps", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed at step 4" in r.stderr
    assert "resuming with changes allowed by --allow-change: train.steps: checkpoint 20, now 24" in r.stderr
    log = next(line for line in r.stderr.splitlines() if line.startswith("resuming with changed settings"))
    for part in ("optim.lr: checkpoint 0.003, now 0.001", "train.micro_batch: checkpoint 4, now 2"):
        assert part in log
    assert _pointer(store)["step"] == 6


def test_a_horizon_below_the_checkpoint_is_refused(resumable):
    train, store = resumable
    r = train("--set", "train.steps=3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert _error_lines(r.stderr) == ["baton: error: the horizon is 3 steps but the checkpoint is at step 4 (raise "
                                      "train.steps or train.target_tokens, or start a new run.name)"]
    # With other differences too, the one message lists every one of them, the horizon's among them.
    r = train("--set", "train.steps=3", "--set", "model.ffn=256", "--set", "data.shuffle_seed=3")
    (line,) = _error_lines(r.stderr)
    assert r.returncode == 2 and line.startswith("baton: error: refusing to resume:"), line
    assert "model.ffn" in line and "data.shuffle_seed" in line and "train.steps" in line, line
    assert _pointer(store)["step"] == 4


def test_allow_change_lets_a_deliberate_change_through(resumable, tmp_path):
    train, store = resumable
    refused = train("--set", "data.shuffle_seed=9")
    assert refused.returncode == 2
    (msg,) = _error_lines(refused.stderr)
    assert "data.shuffle_seed: checkpoint 7, now 9" in msg and "--allow-change for data.shuffle_seed" in msg

    ok = train("--set", "data.shuffle_seed=9", "--allow-change", "data.shuffle_seed", "--stop-after-steps", "5")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "resuming with changes allowed by --allow-change: data.shuffle_seed: checkpoint 7, now 9" in ok.stderr
    p = _pointer(store)
    assert p["step"] == 5 and p["cursor"]["shuffle_seed"] == 9 and p["cursor"]["samples_consumed"] == 40

    for flag, expect in (("model.hidden", "model.hidden cannot change on resume (the checkpoint's weights"),
                         ("train.global_batch", "train.global_batch cannot change on resume (the data cursor"),
                         ("optim.betas", "optim.betas is not a key --allow-change knows")):
        r = train("--allow-change", flag)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        (line,) = _error_lines(r.stderr)
        assert expect in line
    assert _pointer(store)["step"] == 5


def test_allow_change_keys_are_the_documented_ones():
    assert validate_allowed(list(ALLOWABLE)) == set(ALLOWABLE)
    with pytest.raises(BatonError, match="model.n_layers cannot change.*data.seq_len cannot change"):
        validate_allowed(["model.n_layers", "data.seq_len"])


def test_switching_the_optimizer_is_refused_both_ways(resumable, zygote, make_config, tmp_path):
    """AdamW's checkpoint holds moments Muon has no use for, and the other way round: a switch is refused in
    one line, cannot be allowed, and touches nothing; a Muon run resumes as Muon."""
    train, store = resumable
    before = _pointer(store)
    r = train("--set", "optim.name=muon")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = _error_lines(r.stderr)
    assert "refusing to resume: the checkpoint at step 4 differs from this config in what makes it the same run: " \
           "optim.name: checkpoint 'adamw', now 'muon' (restore them, or start a new run.name)" in line
    r = train("--set", "optim.name=muon", "--allow-change", "optim.name")
    assert r.returncode == 2
    (line,) = _error_lines(r.stderr)
    assert "optim.name cannot change on resume (the checkpoint holds that optimizer's state)" in line
    assert _pointer(store) == before

    muon_store = tmp_path / "muon-store"
    cfg = make_config("muon.toml", store=muon_store)

    def muon_train(*args: str):
        return zygote.run(["train", "-c", cfg, "--no-progress", *args], tmp_path / "out-muon", timeout=120)

    assert muon_train("--set", "optim.name=muon", "--stop-after-steps", "3").returncode == 0
    r = muon_train("--stop-after-steps", "4")  # the config's optim.name: adamw
    assert r.returncode == 2
    (line,) = _error_lines(r.stderr)
    assert "optim.name: checkpoint 'muon', now 'adamw'" in line
    ok = muon_train("--set", "optim.name=muon", "--stop-after-steps", "4")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "resumed at step 3" in ok.stderr and _pointer(muon_store)["step"] == 4


def test_a_checkpoint_from_before_optim_name_is_adamw():
    """Checkpoints written before optim.name existed were all AdamW's: they resume as AdamW and no other."""
    from baton.checkpoint.record import CheckpointState
    from baton.config import Config
    from baton.session.drift import differences

    old = Config().to_dict()
    del old["optim"]["name"]
    state = CheckpointState(step=0, total_steps=None, config=old, rng_ranks=[{}], optimizer_param_groups=[],
                            cursor={"dataset_fingerprint": "f", "permutation_fingerprint": "p"})
    new = Config().to_dict()
    assert differences(state, new, "f", "p", "t") == []
    new["optim"]["name"] = "muon"
    assert [str(d) for d in differences(state, new, "f", "p", "t")] == ["optim.name: checkpoint 'adamw', now 'muon'"]
