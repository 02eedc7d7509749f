"""The compile cache across a relay, for real: inductor compiles, each session a fresh interpreter on an empty
machine (its own empty work folder and its own empty TORCHINDUCTOR_CACHE_DIR), so what the second session
finds compiled can only have come from the store.

Session 1 compiles cold and pushes the cache; session 2 pulls it beside the checkpoint, loads it and compiles
warm; its losses and the checkpoint it ends with are bit-identical to a run that never had a cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from baton.runtime import compile_cache as cc
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors

pytestmark = pytest.mark.slow


def _session(baton_cli, cfg: Path, machine: Path, stop: int, *sets: str, inductor: Path | None = None):
    machine.mkdir(parents=True)
    inductor = inductor or machine / "inductor"
    inductor.mkdir(exist_ok=True)
    argv = ["train", "-c", str(cfg), "--stop-after-steps", str(stop), "--set", "train.compile=true",
            "--set", "train.steps=8", "--set", f"run.local_dir={machine / 'work'}"]
    for s in sets:
        argv += ["--set", s]
    baton_cli(*argv, env={"TORCHINDUCTOR_CACHE_DIR": str(inductor)}, check=True, timeout=1800)
    return machine / "work"


def _ledger(store: Path, run: str) -> list[dict]:
    rows = [json.loads(p.read_text()) for p in sorted((store / run / "ledger").glob("*.json"))]
    return sorted(rows, key=lambda r: r["started_ts"])


def test_the_second_session_compiles_warm_from_the_store_with_the_same_numbers(baton_cli, make_config, tmp_path):
    cfg, store = make_config(), tmp_path / "store"
    # The relay: 0 to 2 cold on one empty machine, 2 to 4 on another.
    _session(baton_cli, cfg, tmp_path / "m1", 2, "run.name=relay")
    assert (store / "relay" / "compile-cache").is_dir()
    second = _session(baton_cli, cfg, tmp_path / "m2", 4, "run.name=relay")
    # The run without the store's cache: one session, 0 to 4, on the first machine's disk (inductor's own local
    # cache there saves compiling again; nothing comes from the store).
    ref = _session(baton_cli, cfg, tmp_path / "m-ref", 4, "run.name=ref", "train.compile_cache=false",
                   inductor=tmp_path / "m1" / "inductor")

    first_rec, second_rec = _ledger(store, "relay")
    assert first_rec["startup"]["compile"] == "cold" and "pushed and verified" in first_rec["startup"]["note"]
    assert second_rec["startup"]["compile"] == "warm", second_rec["startup"]
    assert second_rec["startup"]["note"].startswith("compile cache: loaded ")
    carried = int(re.search(r"(\d+) C\+\+ kernels", second_rec["startup"]["note"]).group(1))
    # The CPU's kernels came with it, the instruction-set probes with their markers among them, and inductor
    # built no program of its own on the second machine: no kernel, no probe.
    (blob,) = (store / "relay" / "compile-cache").glob("*.bin")
    in_blob = [rel for rel, _ in cc.unpack(blob.read_bytes())[1]]
    on_m2 = sorted(f"{p.parent.name}/{p.name}" for p in (tmp_path / "m2" / "inductor").glob("*/*.so*"))
    assert carried > 0 and carried == sum(not cc.is_marker(r) for r in in_blob)
    assert on_m2 == sorted(in_blob)
    on_m1 = sorted(f"{p.parent.name}/{p.name}" for p in (tmp_path / "m1" / "inductor").glob("*/*.so*"))
    assert on_m1 == on_m2
    (ref_rec,) = _ledger(store, "ref")
    assert ref_rec["startup"]["compile"] == "cold" and ref_rec["startup"]["note"] is None
    summary = json.loads((second / "relay" / "run_summary.json").read_text())
    assert summary["compile_cache"]["kind"] == "warm" and summary["compile_fallbacks"] == []

    # Bit-identical: every loss, and the weights and moments of the checkpoint at step 4.
    got = {r["step"]: r["loss"] for r in read_metrics(second / "relay")}
    want = {r["step"]: r["loss"] for r in read_metrics(ref / "ref")}
    assert sorted(got) == sorted(want) == [1, 2, 3, 4] and got == want
    a, b = store_checkpoint_tensors(store, "ref"), store_checkpoint_tensors(store, "relay")
    assert a[2]["step"] == b[2]["step"] == 4
    assert_tensors_equal(a[0], b[0])
    assert_tensors_equal(a[1], b[1])
