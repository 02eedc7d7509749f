"""The dataset travels with the run: published once to a store, pulled and verified on every fresh machine.

A "fresh machine" is a new, empty data folder. The stores are real (moto's S3 server behind the counting
proxy, the local Hub server), the `baton` commands are real processes (forked from a pre-imported zygote),
and the kills are real SIGKILLs aimed with the ``data.publish`` / ``data.pull`` fault points.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from pathlib import Path

import pytest

from baton.config import load_config
from baton.data.manifest import MANIFEST, corpus_fingerprint
from baton.data.publish import publish
from baton.data.pull import ensure_data
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors, write_config
from support.store_backends import AWS_TEST_KEY, AWS_TEST_SECRET
from support.zygote import Zygote

STEPS = ["--set", "train.steps=6", "--no-progress"]
DATA_FILES = ["shard-00000.bin", "shard-00001.bin", "shard-00002.bin", "shard-00003.bin", "tokenizer.json"]


@pytest.fixture(scope="module")
def zyg(hub_server):
    env = {"AWS_ACCESS_KEY_ID": AWS_TEST_KEY, "AWS_SECRET_ACCESS_KEY": AWS_TEST_SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": hub_server.token, "HF_ENDPOINT": hub_server.url}
    z = Zygote(env=env, unset=("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"))
    yield z
    z.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared_data, zyg):
    """Six steps trained from the locally prepared folder: the weights every relay must reproduce exactly."""
    base = tmp_path_factory.mktemp("relay-reference")
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    r = zyg.run(["train", "-c", cfg, *STEPS], base / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    return store_checkpoint_tensors(base / "store", "test")[0]


@pytest.fixture(autouse=True)
def hub_env(monkeypatch, hub_server):
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)


def data_url(kind: str, make_backend, hub_server):
    """(data.url, backend or None) of a fresh, empty location of that kind."""
    if kind == "s3":
        b = make_backend("s3")
        return b.url, b
    repo = f"baton-test/d-{uuid.uuid4().hex[:10]}"
    hub_server.create_repo(f"datasets/{repo}")
    return f"hf://datasets/{repo}", None


def config(tmp_path: Path, name: str, data_dir: Path, url: str, store: Path | None = None, *extra: str) -> Path:
    cfg = write_config(tmp_path / f"{name}.toml", data_dir=data_dir, store=store or tmp_path / "store",
                       runs=tmp_path / "runs")
    text = cfg.read_text().replace("[data]\n", f'[data]\nurl = "{url}"\n' + "".join(f"{e}\n" for e in extra))
    cfg.write_text(text)
    return cfg


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every file under ``folder`` with its size, mtime and sha256: what "nothing changed" is checked against."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns,
                                               hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def same_bytes(a: Path, b: Path) -> None:
    for name in [*DATA_FILES, MANIFEST]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_prepare_once_publish_train_anywhere_bit_identical(kind, reference, prepared_data, make_backend, hub_server,
                                                            zyg, tmp_path):
    url, _ = data_url(kind, make_backend, hub_server)
    r = zyg.run(["prepare", "-c", config(tmp_path, "publish", prepared_data, url), "--publish", "--no-progress"],
                tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    prepared = json.loads((prepared_data / MANIFEST).read_text())
    fingerprint = prepared["fingerprint"]
    assert f"5 uploaded (0.3 MB), 0 already held and verified, 0 stale removed; fingerprint {fingerprint}" in r.stdout

    fresh = tmp_path / "fresh-machine" / "data"
    cfg = config(tmp_path, "train", fresh, url)
    r = zyg.run(["train", "-c", cfg, *STEPS], tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pulling 5 of 5 files" in r.stderr and "SHASHED 5 files total_tokens" in r.stderr
    assert_tensors_equal(store_checkpoint_tensors(tmp_path / "store", "test")[0], reference)
    same_bytes(fresh, prepared_data)
    assert not list(fresh.glob("*.pull*"))
    # The ledger knows where the data came from, what it was and how long the pull took.
    (led,) = [json.loads(p.read_text()) for p in (tmp_path / "store" / "test" / "ledger").glob("*.json")]
    assert led["data"]["pulled_files"] == 5 and led["data"]["fingerprint"] == fingerprint
    assert led["data"]["seconds"] > 0 and led["startup_seconds"] >= led["data"]["seconds"]

    # The next session on this machine reuses the verified copy without reading it again.
    again = ensure_data(load_config(cfg))
    assert (again.reused_files, again.hashed_files, again.pulled_files) == (5, 0, 0)
    if kind == "s3":
        plan = zyg.run(["plan", "-c", cfg, "--rate", "1000", "--session-hours", "1"], tmp_path / "out")
        assert plan.returncode == 0, plan.stderr
        assert f"(measured (ledger, session {led['session']}: data pull" in plan.stdout
        status = zyg.run(["status", "-c", cfg], tmp_path / "out")
        assert f"fingerprint {fingerprint} (pulled into {fresh}" in status.stdout
        assert "last data pull:" in status.stdout and "5 files" in status.stdout
        info = zyg.run(["data-info", "-c", cfg], tmp_path / "out")
        assert info.returncode == 0 and f"fingerprint {fingerprint}" in info.stdout, info.stderr[-3000:]
        assert "5 reused as verified before" in info.stderr
        check = zyg.run(["verify-data", "-c", cfg], tmp_path / "out")  # the published copy, rehashed here
        assert check.returncode == 0 and f"5 files hashed, {prepared['total_tokens']:,} tokens, 0 mismatches" in check.stdout, check.stdout
        pf = zyg.run(["preflight", "-c", cfg, "--out", tmp_path / "pf", "--stages", "data"], tmp_path / "out")
        assert pf.returncode == 0, pf.stderr[-3000:]
        report = (tmp_path / "pf" / "report.md").read_text()
        assert "The data on this machine: where it came from, how long the pull took" in report
        assert "data from S3 store" in report and "5 reused as verified before" in report


def wait_for(cond, child, what: str, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while not cond():
        assert child.alive(), f"the process ended before {what}: {child.stderr_text()[-2000:]}"
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_sigkill_during_publish_and_during_pull_then_reruns_transfer_only_the_rest(
        reference, prepared_data, make_backend, zyg, tmp_path):
    b = make_backend("s3")
    one = "transfer_workers = 1"  # one file at a time, so the kills land between whole files
    pub_cfg = config(tmp_path, "publish", prepared_data, b.url, None, one)
    slow_pub = {"BATON_FAULT_PAUSE": "data.publish=0.4"}

    def puts(since: int = 0) -> list[str]:
        return [s.path.split("?")[0].rsplit("/", 1)[1] for s in b.proxy.seen[since:]
                if s.method == "PUT" and s.status == 200]

    child = zyg.spawn(["publish-data", "-c", pub_cfg], tmp_path / "out", env=slow_pub)
    wait_for(lambda: len(puts()) >= 2, child, "two uploads")
    child.kill()
    child.wait(30)
    time.sleep(0.5)  # an upload the proxy had fully received when the client died still lands; let it
    held = set(b.store.list("", checksums=False))
    assert len(held) >= 2 and held <= set(puts())
    assert MANIFEST not in held and b.store.read_text(MANIFEST) is None, "no manifest before every file is verified"
    mark = len(b.proxy.seen)
    r = zyg.run(["publish-data", "-c", pub_cfg], tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    again = puts(mark)
    assert not held & set(again), f"re-uploaded what the store held verified: {held & set(again)}"
    assert sorted(again) == sorted(set(DATA_FILES + [MANIFEST]) - held)
    assert f"{len(held)} already held and verified" in r.stdout

    # The pull, killed after two files are in place, then the rerun trains.
    fresh = tmp_path / "fresh" / "data"
    cfg = config(tmp_path, "train", fresh, b.url, None, one)

    def placed() -> list[str]:
        return sorted(n for n in DATA_FILES if (fresh / n).exists())

    child = zyg.spawn(["train", "-c", cfg, *STEPS], tmp_path / "out", env={"BATON_FAULT_PAUSE": "data.pull=0.4"})
    wait_for(lambda: len(placed()) >= 2, child, "two downloads")
    child.kill()
    child.wait(30)
    before = placed()
    for n in before:  # whatever is under a final name is whole and right
        assert (fresh / n).read_bytes() == (prepared_data / n).read_bytes(), n
    assert not (fresh / MANIFEST).exists()
    mark = len(b.proxy.seen)
    r = zyg.run(["train", "-c", cfg, *STEPS], tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    got = [s.path.split("?")[0].rsplit("/", 1)[1] for s in b.proxy.seen[mark:] if s.method == "GET"]
    assert not set(before) & set(got), f"downloaded again: {set(before) & set(got)}"
    assert set(got) >= set(DATA_FILES) - set(before)
    assert not list(fresh.glob("*.pull*"))
    same_bytes(fresh, prepared_data)
    assert_tensors_equal(store_checkpoint_tensors(tmp_path / "store", "test")[0], reference)


def _edit_manifest(b, change) -> None:
    m = json.loads(b.raw(MANIFEST))
    change(m)
    b.client.put_object(Bucket=b.bucket, Key=b._k(MANIFEST), Body=json.dumps(m, indent=2).encode())


def _subset(prepared: Path, out: Path) -> Path:
    """Another valid dataset: the prepared one without its last shard (a different corpus, fingerprint)."""
    shutil.copytree(prepared, out)
    m = json.loads((out / MANIFEST).read_text())
    last = m["shards"].pop()
    (out / last["file"]).unlink()
    m["n_shards"] -= 1
    m["total_tokens"] -= last["tokens"]
    m["fingerprint"] = corpus_fingerprint(m["shards"], m["tokenizer"]["sha256"], m["dtype"])
    (out / MANIFEST).write_text(json.dumps(m, indent=2))
    return out


def test_damaged_or_changed_dataset_in_the_store_is_refused_before_any_step(prepared_data, make_backend, zyg,
                                                                            tmp_path):
    b = make_backend("s3")
    publish(load_config(config(tmp_path, "publish", prepared_data, b.url)))
    cfg = config(tmp_path, "train", tmp_path / "machine-0", b.url)
    r = zyg.run(["train", "-c", cfg, *STEPS, "--stop-after-steps", "2"], tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    store_before = snapshot(tmp_path / "store")
    run_dir = tmp_path / "runs" / "test"
    metrics_before = read_metrics(run_dir)

    def refused(n: int, *names: str) -> str:
        fresh = tmp_path / f"machine-{n}"
        r = zyg.run(["train", "-c", config(tmp_path, f"m{n}", fresh, b.url), *STEPS], tmp_path / "out")
        lines = [line for line in r.stderr.splitlines() if line.startswith("baton: error:")]
        assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
        assert all(name in lines[0] for name in names), lines[0]
        assert snapshot(tmp_path / "store") == store_before, "the run's checkpoint store changed"
        assert read_metrics(run_dir) == metrics_before, "a step ran"
        assert not (fresh / MANIFEST).exists() and not list(fresh.glob("*.pull*"))
        return lines[0]

    # A resume the drift check refuses is refused on the published manifest, before the dataset is downloaded.
    r = zyg.run(["train", "-c", config(tmp_path, "m0", tmp_path / "machine-0b", b.url), *STEPS,
                 "--set", "data.seq_len=16"], tmp_path / "out")
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("baton: error:")]
    assert r.returncode == 2 and "refusing to resume" in line and "data.seq_len: checkpoint 32, now 16" in line, line
    assert "was not downloaded" in line and not list((tmp_path / "machine-0b").glob("shard-*"))
    b.flip("shard-00001.bin", 1000)
    refused(1, "shard-00001.bin", "sha256", "baton publish-data")
    b.remove("shard-00002.bin")
    refused(2, "missing: shard-00002.bin", "baton publish-data")
    # Publishing again repairs the store: only the two damaged files go up again.
    assert publish(load_config(config(tmp_path, "publish", prepared_data, b.url))).uploaded == 2
    _edit_manifest(b, lambda m: m["shards"][0].update(tokens=m["shards"][0]["tokens"] - 1))
    refused(3, "manifest.json", "was changed after it was published", "baton publish-data")

    # Re-published with another corpus between sessions: the resume is refused by the drift check ...
    other = publish(load_config(config(tmp_path, "publish-other", _subset(prepared_data, tmp_path / "other"), b.url)))
    assert other.removed == 1  # the old dataset's extra shard is gone from the store
    machine0, mark = snapshot(tmp_path / "machine-0"), len(b.proxy.seen)
    r = zyg.run(["train", "-c", cfg, *STEPS], tmp_path / "out")
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("baton: error:")]
    assert "refusing to resume" in line and "data.fingerprint" in line and "--allow-change" in line
    # ... on the published manifest alone: the other dataset is not downloaded only to be refused.
    assert "was not downloaded" in line
    assert not [s.path for s in b.proxy.seen[mark:] if s.method == "GET" and "/shard-" in s.path]
    assert snapshot(tmp_path / "machine-0") == machine0
    # The same with the checkpoint named by --resume PATH (here: the store's own copy of it).
    ckpt = tmp_path / "store" / "test" / json.loads((tmp_path / "store" / "test" / "latest.json").read_text())["path"]
    r = zyg.run(["train", "-c", cfg, *STEPS, "--resume", ckpt], tmp_path / "out")
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("baton: error:")]
    assert r.returncode == 2 and "data.fingerprint" in line and "was not downloaded" in line, line
    assert snapshot(tmp_path / "machine-0") == machine0
    ckpts = {k: v for k, v in store_before.items() if "/ledger/" not in k}
    assert {k: v for k, v in snapshot(tmp_path / "store").items() if "/ledger/" not in k} == ckpts  # a failed
    assert read_metrics(run_dir) == metrics_before  # session is billed in the ledger; nothing else changes
    # ... unless the change is meant.
    r = zyg.run(["train", "-c", cfg, *STEPS, "--allow-change", "data.fingerprint"], tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    assert max(row["step"] for row in read_metrics(run_dir)) == 6
    assert json.loads((tmp_path / "store" / "test" / "latest.json").read_text())["cursor"]["dataset_fingerprint"] \
        == other.fingerprint


def test_a_read_only_input_folder_is_a_data_source_and_is_never_written(prepared_data, tmp_path):
    ro = tmp_path / "input" / "dataset"
    shutil.copytree(prepared_data, ro)
    for p in [ro, *ro.iterdir()]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = snapshot(ro.parent)
    try:
        # Copied from the mount into a working folder ...
        copy = ensure_data(load_config(config(tmp_path, "copy", tmp_path / "work", str(ro))))
        assert (copy.pulled_files, copy.in_place) == (5, False)
        same_bytes(tmp_path / "work", prepared_data)
        # ... or used where it lies: hashed once, then reused, and nothing written into it.
        cfg = load_config(config(tmp_path, "in-place", ro, f"file://{ro}"))
        first, second = ensure_data(cfg), ensure_data(cfg)
        assert (first.in_place, first.pulled_files, first.hashed_files) == (True, 0, 5)
        assert (second.reused_files, second.hashed_files) == (5, 0)
        assert snapshot(ro.parent) == before
    finally:
        for p in [ro, *ro.iterdir()]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_two_pullers_into_one_data_dir_take_turns(prepared_data, tmp_path, monkeypatch):
    """Nodes sharing a file system (or two sessions on one machine) pull into the same data.dir: one pulls,
    the other waits for it and finds the copy verified, instead of clearing and renaming the other's files."""
    import threading

    monkeypatch.setenv("BATON_FAULT_PAUSE", "data.pull=0.2")  # the first puller is still at it when the second starts
    shared = tmp_path / "shared" / "data"
    cfg = load_config(config(tmp_path, "c", shared, str(prepared_data), None, "transfer_workers = 1"))
    results: dict = {}

    def pull(n: str) -> None:
        try:
            results[n] = ensure_data(cfg)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            results[n] = e

    first = threading.Thread(target=pull, args=("first",))
    first.start()
    t0 = time.monotonic()
    while not (shared / DATA_FILES[0]).exists() and first.is_alive():
        assert time.monotonic() - t0 < 120, "the first pull never placed a file"
        time.sleep(0.01)
    second = threading.Thread(target=pull, args=("second",))
    second.start()
    first.join(120)
    second.join(120)
    assert [getattr(results.get(n), "pulled_files", results.get(n)) for n in ("first", "second")] == [5, 0], results
    same_bytes(shared, prepared_data)
    assert not list(shared.glob("*.pull*"))


def test_a_store_outage_during_the_pull_says_so_and_the_rerun_completes(prepared_data, make_backend, tmp_path):
    """A store that stops answering mid-pull is an outage (rerun), not a damaged dataset (republish)."""
    from baton.errors import StoreError

    b = make_backend("s3")
    publish(load_config(config(tmp_path, "publish", prepared_data, b.url)))
    fresh = tmp_path / "fresh" / "data"
    cfg = load_config(config(tmp_path, "train", fresh, b.url), ["store.retries=2", "store.retry_seconds=1"])
    b.fault("status", status=503, match=lambda method, path: method == "GET" and "shard-00002" in path)
    with pytest.raises(StoreError, match="shard-00002.bin failed in S3 store .*looks down or unreachable") as e:
        ensure_data(cfg)
    assert "republish" not in str(e.value)
    assert not (fresh / MANIFEST).exists() and not list(fresh.glob("*.pull*"))
    b.clear_faults()
    again = ensure_data(cfg)
    assert again.pulled_files == 1 and again.hashed_files == 5  # the four files already in place are kept
    same_bytes(fresh, prepared_data)


def test_data_url_must_be_its_own_location(tmp_path):
    from baton.errors import ConfigError

    with pytest.raises(ConfigError, match="data.url is the same location as store.url"):
        load_config(None, [f"store.url={tmp_path}", f"data.url={tmp_path}/"])
    with pytest.raises(ConfigError, match="data.url must not carry credentials"):
        load_config(None, ["data.url=s3://key:secret@bucket/data"])


def test_two_ranks_on_a_fresh_machine_pull_one_verified_copy_and_both_train_on_it(prepared_data, make_backend,
                                                                                  tmp_path, monkeypatch):
    """torchrun with 2 gloo ranks and an empty data.dir: one process of the node pulls (one GET per file) and
    verifies, the other waits for it, and both read their share of every global batch from the pulled copy.
    Launched through the Python API (``baton.train(cfg, nproc=2)``), as a notebook does."""
    import baton
    from support.distrun import GLOBAL_BATCH, expected_batch_shas

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two ranks on a two-core machine must not oversubscribe it
    b = make_backend("s3")
    published = publish(load_config(config(tmp_path, "publish", prepared_data, b.url)))
    fresh = tmp_path / "fresh-machine" / "data"
    mark = len(b.proxy.seen)
    baton.train(load_config(config(tmp_path, "train", fresh, b.url), ["train.steps=3"]), nproc=2, progress=False,
                stream_output=False)
    got = [s.path.split("?")[0].rsplit("/", 1)[1] for s in b.proxy.seen[mark:] if s.method == "GET"]
    assert sorted(n for n in got if n in DATA_FILES + [MANIFEST]) == sorted(DATA_FILES + [MANIFEST]), got
    same_bytes(fresh, prepared_data)
    logs = [(tmp_path / "runs" / "test" / "logs" / f"rank-{k}.log").read_text() for k in (0, 1)]
    assert [log.count("SHASHED 5 files") for log in logs] == [1, 0]  # verified once, by the node's puller
    run = tmp_path / "runs" / "test"
    rows = read_metrics(run)
    assert [row["batch_sha"] for row in rows] == expected_batch_shas(prepared_data, 3)  # both ranks' shares
    assert rows[-1]["samples_consumed"] == 3 * GLOBAL_BATCH
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["world_size"] == 2
    pointer = json.loads((tmp_path / "store" / "test" / "latest.json").read_text())
    assert pointer["cursor"]["dataset_fingerprint"] == published.fingerprint
