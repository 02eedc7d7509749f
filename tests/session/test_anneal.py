"""Cooldown branches (`baton anneal`): the tokens after the branch point, the same exact resume as the main run,
bad requests refused before anything is written, the main run untouched, the branch's sessions in the ledger and
known to status, report, eval and export."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from baton.cli import main
from baton.config import load_config
from baton.data.reader import WindowDataset
from baton.loop import run
from baton.planning import ledger as L
from baton.store import open_store
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors
from support.kills import kill_when

# The main run: 20 steps, warmup 4, its cooldown from step 16; a verified checkpoint every 4 steps, all kept.
MAIN = ["train.ckpt_every=4", "store.keep_last=10", "train.log_every=50"]
TPS = 8 * 32  # global_batch x seq_len of the tests' config
BRANCH = "anneal-8-1024"  # from step 8, 4 steps


def _sets(items: list[str]) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _digest(rows: np.ndarray) -> str:
    """A global batch's digest as a session computes it (session.core): each sample's 31-bit blake2b, summed in
    float64 over ranks (one rank here), the int64 bytes hashed."""
    each = [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=4).digest(), "little") >> 1 for r in rows]
    return hashlib.sha256(np.array(each, dtype=np.float64).astype("int64").tobytes()).hexdigest()[:16]


@pytest.fixture
def main_run(make_config, tmp_path):
    """A finished 20-step main run with verified checkpoints at 4, 8, ..., 20; returns the config's path."""
    cfg = str(make_config())
    run(load_config(cfg, MAIN), progress=False)
    return cfg


def test_a_branch_reads_the_tokens_after_its_branch_point_and_leaves_the_main_run_alone(main_run, tmp_path,
                                                                                         prepared_data, capsys):
    store, runs = tmp_path / "store", tmp_path / "runs"
    before = _files(store / "test")
    assert main(["anneal", "-c", main_run, *_sets(MAIN), "--step", "8", "--tokens", "1100", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"cooldown branch {BRANCH}: from step 8 of run 'test', 4 steps of 256 tokens (1,024 tokens) to step 12" in out

    # The main run's pointer, checkpoints, retention and ledger: byte for byte as they were.
    after = _files(store / "test")
    assert {k: v for k, v in after.items() if not k.startswith("branches/")} == before

    # The branch's batches are the data's global batches 8..11, recomputed here from the shards; the main run read the
    # same ones at its steps 9..12, and none of the windows of its steps 1..8.
    ds = WindowDataset(prepared_data, 32, 7, 16)
    want = [_digest(ds.rank_rows(s, 8, 0, 1).numpy()[:, :-1]) for s in range(8, 12)]
    rows = read_metrics(runs / "test" / "branches" / BRANCH)
    mine = [r for r in rows if r["step"] > 8]
    assert [r["step"] for r in mine] == [9, 10, 11, 12]
    assert [r["batch_sha"] for r in mine] == want
    assert [r["batch_sha"] for r in read_metrics(runs / "test") if 9 <= r["step"] <= 12] == want
    seen, read = ds.train_window_ids(0, 8 * 8), ds.train_window_ids(8 * 8, 4 * 8)
    assert not set(seen.tolist()) & set(read.tolist())
    # Its rows up to the branch point are the main run's; its learning rate falls from the peak over its 4 steps.
    assert [r["batch_sha"] for r in rows if r["step"] <= 8] == [r["batch_sha"] for r in read_metrics(runs / "test")
                                                                 if r["step"] <= 8]
    assert [r["lr"] for r in mine] == [3e-3 * f for f in (1.0, 0.75, 0.5, 0.25)]

    # A branch is the run that had its cooldown at step 8 from the start: same steps, same weights.
    run(load_config(main_run, [*MAIN, "run.name=direct", "train.steps=12", "optim.decay_step=8"]), progress=False)
    trace = [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["batch_sha"]) for r in rows]
    assert trace == [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["batch_sha"])
                     for r in read_metrics(runs / "direct")]
    model_a, optim_a, pa = store_checkpoint_tensors(store, f"test/branches/{BRANCH}")
    model_b, optim_b, pb = store_checkpoint_tensors(store, "direct")
    assert pa["step"] == pb["step"] == 12 and pa["complete"] and pb["complete"]
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)
    assert (store / "test" / "branches" / BRANCH / "final" / "model.safetensors").is_file()

    # Its sessions are in the ledger with their branch, billed to the run: `baton ledger` and `baton plan` count them.
    s = open_store(str(store))
    records, problems = L.read_run_ledgers(s, "test")
    assert not problems
    assert [r.branch for r in records if r.branch] == [BRANCH]
    assert len(records) == len(L.read_ledger(s, "test")[0]) + 1
    assert main(["ledger", "-c", main_run]) == 0
    assert f"8 → 12 (branch {BRANCH})" in capsys.readouterr().out
    from baton.cli import build_parser
    from baton.views.plan import plan_input

    args = build_parser().parse_args(["plan", "-c", main_run, "--rate", "1k", "--session-hours", "1",
                                      "--quota-hours", "100", "--quota-reset", "2020-01-01T00:00Z"])
    inp, _, planned = plan_input(args, load_config(main_run))
    assert len(planned) == len(records)
    assert inp.used_hours == pytest.approx(L.totals(records, L.quota_from(load_config(
        None, ["budget.quota_hours=100", "budget.quota_reset=2020-01-01T00:00Z"]).budget)).period_hours)

    # status, report, eval and export know it.
    assert main(["status", "-c", main_run]) == 0
    assert f"cooldown branch {BRANCH}: from step 8 over 1,024 tokens; complete, val_loss" in capsys.readouterr().out
    assert main(["status", "-c", main_run, "--branch", BRANCH]) == 0
    out = capsys.readouterr().out
    assert f"run test/branches/{BRANCH} in" in out and "pointer: step 12 of 12" in out and "(run complete)" in out
    assert main(["eval", "-c", main_run, "--branch", BRANCH]) == 0
    assert (store / "test" / "branches" / BRANCH / "eval" / "12.json").is_file()
    # the record's place, a key in the store, not a path beside the person reading it
    assert capsys.readouterr().out.splitlines()[-1] == f"written to test/branches/{BRANCH}/eval/12.json in local " \
                                                       f"store {store}"
    assert main(["eval", "-c", main_run, "--step", "8"]) == 0
    assert main(["export", "-c", main_run, "--branch", BRANCH, "--out", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "model.safetensors").read_bytes() == \
        (store / "test" / "branches" / BRANCH / "final" / "model.safetensors").read_bytes()
    assert main(["report", "-c", main_run, "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Cooldown branches" in report and f"| {BRANCH} | 8 (2,048 tokens) | 1,024 | complete |" in report
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [b["name"] for b in doc["branches"]] == [BRANCH] and doc["branches"][0]["val"][-1]["step"] == 12
    assert [e["step"] for e in doc["evals"]] == [8]
    from baton import extras

    if extras.plotting("the test"):
        assert (tmp_path / "report" / "validation.png").is_file()

    # Asked again (the same branch, by its share of the tokens seen): complete, nothing to do.
    done = _files(store / "test" / "branches" / BRANCH)
    assert main(["anneal", "-c", main_run, *_sets(MAIN), "--step", "8", "--fraction", "0.5", "--no-progress"]) == 0
    assert "is complete" in capsys.readouterr().err
    assert {k: v for k, v in _files(store / "test" / "branches" / BRANCH).items() if "ledger/" not in k
            and k != "lease"} == {k: v for k, v in done.items() if "ledger/" not in k and k != "lease"}


def test_a_killed_branch_resumes_bit_identical(make_config, tmp_path):
    """A real `baton anneal` process SIGKILLed inside the branch, then run again, ends in the bytes of a branch that
    was never interrupted."""
    cfg = str(make_config())
    run(load_config(cfg, MAIN), progress=False)
    shutil.copytree(tmp_path / "store", tmp_path / "store2")  # the same main run in a second store
    branch = ["--step", "8", "--tokens", str(8 * TPS), "--no-progress"]  # 8 steps, a checkpoint every 2
    every2 = [*MAIN, "train.ckpt_every=2"]
    assert main(["anneal", "-c", cfg, *_sets(every2), *branch]) == 0

    other = [*every2, f"store.url={tmp_path / 'store2'}", f"run.local_dir={tmp_path / 'runs2'}"]
    pointer = tmp_path / "store2" / "test" / "branches" / "anneal-8-2048" / "latest.json"

    def inside() -> bool:  # the branch's first checkpoint is verified, its last step not yet made
        try:
            return json.loads(pointer.read_text())["step"] >= 10
        except (OSError, ValueError):
            return False

    env = {**os.environ, "BATON_FAULT_PAUSE": "step=0.15"}  # steps slow enough for the kill to land among them
    kill_when([sys.executable, "-m", "baton.cli", "anneal", "-c", cfg, *_sets(other), *branch], inside,
              cwd=tmp_path, env=env)
    killed_at = json.loads(pointer.read_text())["step"]
    assert 10 <= killed_at < 16
    assert main(["anneal", "-c", cfg, *_sets(other), *branch]) == 0

    final = Path("test/branches/anneal-8-2048/final/model.safetensors")
    assert (tmp_path / "store2" / final).read_bytes() == (tmp_path / "store" / final).read_bytes()
    model_a, optim_a, pa = store_checkpoint_tensors(tmp_path / "store", "test/branches/anneal-8-2048")
    model_b, optim_b, pb = store_checkpoint_tensors(tmp_path / "store2", "test/branches/anneal-8-2048")
    assert pa["step"] == pb["step"] == 16 and pa["val_loss"] == pb["val_loss"]
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)
    sessions = [r for r in L.read_run_ledgers(open_store(str(tmp_path / "store2")), "test")[0] if r.branch]
    assert sorted(r.steps_from for r in sessions) == [8, killed_at]  # (this process's session counts from its start)


@pytest.fixture(scope="module")
def finished_main(tmp_path_factory, prepared_data):
    """A finished main run, made once for the refusals below (none of them writes)."""
    from support.helpers import write_config

    base = tmp_path_factory.mktemp("anneal-refusals")
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    run(load_config(cfg, MAIN), progress=False)
    return str(cfg), base


@pytest.mark.parametrize("flags, words", [
    (["--step", "6", "--tokens", "1024"], "step 6 is not a verified checkpoint of run 'test'"),
    (["--step", "20", "--tokens", "1024"], "step 20 of run 'test' is inside the main run's cooldown, which began at "
                                            "step 16 of its 20-step schedule: a branch starts from a plateau "
                                            "checkpoint, steps 4-16 (verified there: 4, 8, 12, 16)"),
    (["--step", "8", "--tokens", "1G"], "--tokens 1,000,000,000 would cool down to step 3,906,258"),
    (["--step", "8", "--tokens", "1024", "--set", "optim.schedule=cosine"],
     "run 'test' uses the cosine schedule, which decays from the end of its warmup: a cooldown branch starts from a "
     "checkpoint on a wsd plateau"),
    (["--step", "8", "--tokens", "100"], "--tokens 100 is less than one step of 256 tokens"),
    (["--step", "8", "--fraction", "1.5"], "--fraction 1.5 must be in (0, 1]"),
    (["--step", "8", "--fraction", "0.2", "--tokens", "1024"], "argument --tokens: not allowed with argument --fraction"),
    (["--step", "8"], "anneal needs one of --tokens T (the cooldown's length) and --fraction F"),
    (["--tokens", "1024"], "anneal needs --step N: the main run's verified checkpoint to branch from"),
])
def test_bad_requests_are_refused_in_one_line_and_write_nothing(finished_main, capsys, flags, words):
    cfg, base = finished_main
    before = _files(base / "store")
    assert main(["anneal", "-c", cfg, *_sets(MAIN), *flags]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("baton: error:")]
    assert len(errors) == 1 and words in errors[0], err
    assert _files(base / "store") == before  # nothing written: no branch, no ledger line, no lease
    assert not (base / "store" / "test" / "branches").exists()


def test_the_beyond_the_data_refusal_names_the_room_left(finished_main, capsys):
    cfg, _ = finished_main
    assert main(["anneal", "-c", cfg, *_sets(MAIN), "--step", "8", "--tokens", "1G"]) == 2
    err = capsys.readouterr().err
    assert "beyond the data: one pass over its" in err and "never one twice (at most" in err and "from step 8)" in err


def test_a_branch_config_must_be_the_branch_its_name_says():
    ok = load_config(None, ["run.name=r/branches/anneal-8-1024", "data.seq_len=32", "train.global_batch=8",
                            "train.steps=12", "optim.decay_step=8"])
    assert ok.total_steps == 12
    from baton.errors import ConfigError

    with pytest.raises(ConfigError, match=r"needs optim.decay_step = 8 \(not 0\), train.steps = 12 \(not 1000\)"):
        load_config(None, ["run.name=r/branches/anneal-8-1024", "data.seq_len=32", "train.global_batch=8"])
    with pytest.raises(ConfigError, match="must be a plain name"):
        load_config(None, ["run.name=r/branches/other"])


def test_decay_step_places_the_wsd_cooldown():
    from baton.model.schedule import lr_factor

    f = [lr_factor(s, 12, warmup_steps=4, decay_step=8) for s in range(12)]
    # warmup to step 3, the plateau to step 8 (the first decay step, still at the peak), then down towards 0
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]


def test_a_finished_branch_is_published_at_a_revision_named_for_it(make_config, tmp_path):
    cfg = str(make_config())
    published = tmp_path / "published"
    sets = [*MAIN, f"publish.url={published}", "publish.every=4"]
    run(load_config(cfg, sets), progress=False)
    main_files = _files(published)
    assert main(["anneal", "-c", cfg, *_sets(sets), "--step", "8", "--tokens", "2048", "--no-progress"]) == 0
    # The branch's model and card at the revision anneal-8-2048 (a folder here, a branch on the Hub); its steps make
    # no step-N revisions (those are the main run's), and the main run's publications are as they were.
    folder = published / "anneal-8-2048"
    assert (folder / "model.safetensors").read_bytes() == \
        (tmp_path / "store" / "test" / "branches" / "anneal-8-2048" / "final" / "model.safetensors").read_bytes()
    assert "test/branches/anneal-8-2048" in (folder / "README.md").read_text()
    assert {k: v for k, v in _files(published).items() if not k.startswith("anneal-8-2048/")} == main_files
