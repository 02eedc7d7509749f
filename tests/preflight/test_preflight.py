"""`baton preflight`: all rows pass on a healthy setup; breaking one thing fails exactly its rows."""

import json
import re
import shutil

import pytest

from baton.data.manifest import load_manifest
from baton.data.shards import HEADER_SIZE

MARK = {"✅": "pass", "❌": "fail", "not proven": "not proven"}


def _report_rows(report: str) -> list[dict]:
    section = report.split("## Scorecard", 1)[1].split("## Stages", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"^\| (\d+) \| (.+?) \| (\S+) \| (✅|❌|not proven) \|", line)
        if m:
            rows.append({"n": int(m.group(1)), "requirement": m.group(2), "stage": m.group(3),
                         "result": MARK[m.group(4)]})
    return rows


def _results(doc) -> dict[str, str]:
    return {r["requirement"]: r["result"] for r in doc["scorecard"]}


@pytest.fixture
def preflight(make_config, baton_cli, tmp_path):
    def run(*extra, data=None, stages=None):
        cfg = str(make_config())
        out = tmp_path / "pf"
        args = ["preflight", "-c", cfg, "--out", str(out), "--leg-steps", "2"]
        if data is not None:
            args += ["--set", f"data.dir={data}"]
        if stages:
            args += ["--stages", stages]
        p = baton_cli(*args, *extra)
        doc = json.loads((out / "preflight.json").read_text())
        return p, doc, (out / "report.md").read_text(), out

    return run


def test_all_rows_pass_and_the_report_agrees_with_the_json(preflight):
    p, doc, report, out = preflight()
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert doc["verdict"] == "PASS" and "VERDICT PASS" in p.stdout
    results = _results(doc)
    assert results.pop("Stable loss over a few thousand steps") == "not proven"
    assert set(results.values()) == {"pass"}, results
    assert _report_rows(report) == [{k: r[k] for k in ("n", "requirement", "stage", "result")} for r in doc["scorecard"]]
    # plots are PNG files linked from the Markdown
    for png in ("loss_legs.png", "throughput.png", "finish.png", "cadence.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report
    assert "## Limitations" in report and "not prove" in report
    stop = doc["stages"]["stop_probe"]
    assert stop["numbers"]["verdict"] == "VERDICT PASS" and len(stop["checks"]) >= 10
    assert doc["stages"]["resume"]["numbers"]["samples_consumed"] == [16, 32, 48]
    assert doc["stages"]["throughput"]["numbers"]["plan"]["sessions"]
    sim = doc["stages"]["throughput"]["numbers"]["simulated"]  # the plan with sessions cut at random
    assert sim["p50"] <= sim["p90"] and f"finish P50 {sim['p50']}, P90 {sim['p90']}" in report
    # scratch runs are cleaned from the store; each stage is billed in the run's ledger
    store = out.parent / "store"
    assert not any(store.glob("test-preflight-*/ckpt"))
    kinds = sorted(json.loads(f.read_text())["kind"] for f in (store / "test" / "ledger").glob("*.json"))
    assert kinds == sorted(f"preflight:{s}" for s in doc["stages"])


def test_a_tampered_shard_fails_exactly_the_data_row(preflight, prepared_data, tmp_path):
    data = tmp_path / "tampered"
    shutil.copytree(prepared_data, data)
    victim = data / load_manifest(data)["shards"][0]["file"]
    raw = bytearray(victim.read_bytes())
    raw[HEADER_SIZE + 100] ^= 0xFF
    victim.write_bytes(bytes(raw))
    p, doc, report, _ = preflight(data=data, stages="construct,data,storage")
    assert p.returncode == 1 and doc["verdict"] == "FAIL"
    failed = [r["requirement"] for r in doc["scorecard"] if r["result"] == "fail"]
    assert failed == ["Data bytes match the manifest"]
    # The shard is named in the scorecard row, in the data stage's check line and on the console, not only in
    # the collapsed numbers.
    row = next(r for r in doc["scorecard"] if r["requirement"] == "Data bytes match the manifest")
    assert victim.name in row["evidence"]
    check = next(c for c in doc["stages"]["data"]["checks"] if c["name"] == "every shard hashes to its manifest entry")
    assert check["ok"] is False and victim.name in check["detail"]
    scorecard = report.split("## Scorecard", 1)[1].split("## Stages", 1)[0]
    assert victim.name in scorecard
    assert victim.name in report.split("### 2. data", 1)[1].split("<details>", 1)[0]
    assert victim.name in p.stdout
    # The construct stage measures the configured schedule and the report draws it.
    shape = doc["stages"]["construct"]["numbers"]["schedule"]
    assert (shape["schedule"], shape["step_decay_start"], shape["factor_decay_start"]) == ("wsd", 16, 1.0)
    assert "learning rate: wsd, linear cooldown, warmup 4, decay from step 16" in report


def test_a_resume_that_would_change_the_data_order_fails_the_resume_rows(preflight):
    p, doc, report, _ = preflight("--resume-set", "data.shuffle_seed=99", stages="data,resume")
    assert p.returncode == 1 and doc["verdict"] == "FAIL"
    r = _results(doc)
    assert r["Resumption from the exact data position"] == "pass"
    assert r["Cold resume from an empty disk, three legs, position never drifting backwards"] == "fail"
    assert r["Stop at a boundary, resume from the store alone, evaluate and export"] == "not proven"
    assert r["Checkpoint push proven by the store (listing + ranged read-back), pointer read back, then prune"] == "not proven"
    assert "data.shuffle_seed: checkpoint 7, now 99" in report


def test_storage_stage_at_the_reference_checkpoint_size_on_cpu(baton_cli, tmp_path):
    out = tmp_path / "pf-ref"
    # fp32: the checkpoint holds fp32 masters and Adam's moments whatever the precision, and the config's fp16
    # autocast has no fast kernels on a CPU (one backward of the construct stage took 16 s of the test's 60).
    p = baton_cli("preflight", "-c", "configs/ref-106m.toml", "--scale", "real", "--stages", "construct,storage",
                  "--store", str(tmp_path / "store"), "--out", str(out), "--set", 'train.precision="fp32"')
    doc = json.loads((out / "preflight.json").read_text())
    storage = doc["stages"]["storage"]
    assert storage["status"] == "pass", storage
    # A PASS of two stages says how little it covers, in the report and on the terminal.
    assert "**VERDICT PASS** (5 of 14 requirements proven, 9 not proven)" in (out / "report.md").read_text()
    assert "VERDICT PASS  (5 of 14 requirements proven, 9 not proven; report:" in p.stdout
    n = storage["numbers"]
    # fp32 weights + Adam m and v of 106,194,240 parameters: about 1.27 GB
    assert 1.27e9 < n["checkpoint_bytes"] < 1.28e9
    for key in ("save_seconds", "push_verify_seconds", "cold_pull_seconds"):
        assert n[key] > 0
    assert doc["stages"]["construct"]["numbers"]["params_built"] == 106_194_240
    assert doc["stages"]["data"]["status"] == "not proven"
    assert p.returncode == 0, p.stderr[-2000:]


def test_the_throughput_stage_measures_an_auto_micro_batch(make_config, tmp_path):
    """micro_batch = "auto" (the config's choice on a GPU) made the stage fail with a TypeError; it now
    measures what `baton train` would pick on this device (on CPU: 4 of a global batch of 8) and half of it."""
    from baton.preflight.core import Context
    from baton.preflight.legs import stage_throughput

    ctx = Context(str(make_config()), ['train.micro_batch="auto"'], "real", tmp_path / "pf", str(tmp_path / "store"),
                  leg_steps=2, session_hours=12.0)
    r = stage_throughput(ctx)
    assert r.status == "pass" and not r.error, (r.error, r.checks)
    assert [c["label"] for c in r.numbers["cells"]] == ["sdpa s32 m2x4", "sdpa s32 m4x2"]
    assert r.numbers["plan"]["sessions"][-1]["stop_after_steps"] == 20


def test_the_plan_section_says_a_stand_in_s_eta_is_not_the_configured_model_s():
    """At --scale tiny the rate is the stand-in's: the report's plan said "0.0 GPU-hours" for the configured
    horizon as if measured. It now gives the hours it computed and says plainly they are not proven."""
    from baton.planning.plan import PlanInput, plan
    from baton.preflight.report import _plan_section

    p = plan(PlanInput(total_steps=20, tokens_per_step=256, rate=200.0, session_hours=12.0)).to_dict()
    tp = {"numbers": {"plan": p, "picked": "sdpa s32 m4x2"}}
    tiny = "\n".join(_plan_section(tp, "tiny"))
    assert "**0.0071 h** of stepping" in tiny and "**0.0071 GPU-hours** billed" in tiny
    assert "Not the configured model's ETA" in tiny and "not proven for the configured shape" in tiny
    assert "Not the configured model's ETA" not in "\n".join(_plan_section(tp, "real"))


def test_the_construct_stage_exercises_what_precision_auto_resolves_to(make_config, tmp_path, monkeypatch):
    # On a T4 auto is fp16, on Ampere+ bf16: the stage must run that, not fp32. Here the device's answer is
    # bf16 (what an A100 gives), which autocast also runs on CPU.
    from baton.preflight import static
    from baton.preflight.core import Context

    monkeypatch.setattr(static, "resolve_precision", lambda device: "bf16")
    ctx = Context(config_path=str(make_config()), overrides=["train.precision=auto"], scale="tiny", out=tmp_path,
                  store_url=str(tmp_path / "store"), leg_steps=2, session_hours=1.0)
    r = static.stage_construct(ctx)
    assert r.error is None and r.numbers["precision"]["configured"] == "auto"
    assert r.numbers["precision"]["tested"] == "bf16"


def test_a_second_preflight_of_the_run_against_one_store_is_refused_in_one_line(preflight, make_config, baton_cli,
                                                                                  tmp_path):
    """Two preflights of one run against one store emptied and rolled each other's scratch runs and failed with a
    misleading resume error. The first holds the lease of <run>-preflight while its stages run; the second is
    refused before it touches anything, and the first's lease is released when it ends."""
    from baton.store.lease import Lease, read_lease
    from baton.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    other = Lease(store, "test-preflight", "the-other-preflight", 600.0)
    other.acquire()  # a preflight running now, on this machine (this process is alive)
    p = baton_cli("preflight", "-c", str(make_config()), "--out", str(tmp_path / "refused"), "--stages", "storage")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        f"baton: error: another `baton preflight` of run 'test' is using its scratch runs in local store "
        f"{tmp_path / 'store'} (session the-other-preflight on host {other.record.host} (pid {other.record.pid})): "
        "wait for it to end (one whose machine died frees them store.lease_seconds after its last renewal), or run "
        "this one under another run.name")
    assert not (tmp_path / "refused" / "preflight.json").exists()
    other.release()
    p, doc, _, _ = preflight(stages="storage")
    assert p.returncode == 0 and doc["stages"]["storage"]["status"] == "pass", p.stderr[-2000:]
    assert read_lease(store, "test-preflight")[0].released


def test_a_store_that_cannot_hold_the_lease_fails_the_storage_row_not_the_report(make_config, baton_cli, tmp_path):
    """The scratch runs' lease is taken from the store under test: a store that cannot be written is the storage
    stage's failure, reported in the scorecard beside the stages that need no store, not an end without one."""
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "pf"
    p = baton_cli("preflight", "-c", str(make_config()), "--out", str(out), "--stages", "construct,storage",
                  "--store", str(tmp_path / "a-file" / "store"))
    doc = json.loads((out / "preflight.json").read_text())
    assert p.returncode == 1 and doc["verdict"] == "FAIL", p.stderr[-2000:]
    assert doc["stages"]["construct"]["status"] == "pass"
    assert doc["stages"]["storage"]["status"] == "fail" and "StoreError" in doc["stages"]["storage"]["error"]
