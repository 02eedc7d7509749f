"""Security: store credentials never appear in any output, and a run's store writes and deletes stay inside
its own prefix.

The processes run with recognisable fake credentials (conftest.SECRETS) for S3, the Hub, W&B and MLflow;
the S3 test server accepts them. The test then searches every byte the runs produced: each process's
stdout and stderr, every file under the local run folders (logs, metrics, summary, tensorboard, W&B's
offline run, exports), MLflow's file store, and every object in both stores (checkpoints with their saved
config, pointers, ledgers, the trackers' record).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from support.chaos import LocalView, S3View
from support.fake_credentials import (
    FAKE_KEY,
    FAKE_MLFLOW_PASSWORD,
    FAKE_MLFLOW_TOKEN,
    FAKE_SECRET,
    FAKE_WANDB_KEY,
    SECRETS,
)


def _leaks(blobs: dict[str, bytes]) -> list[str]:
    return [f"{where} contains {s[:6]}…" for where, data in blobs.items() for s in SECRETS if s.encode() in data]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()} if root.exists() else {}


def _neighbours_local(root: Path) -> dict[str, bytes]:
    """Objects next to run 'test' whose names start like it: another run's, or a stray file."""
    files = {"test2/ckpt/step-2/model.safetensors": b"another run", "test2/latest.json": b"{}",
             "test-b/ckpt/step-1/state.json": b"{}", "tes/ckpt/step-1/x": b"x", "test.json": b"root file",
             "ckpt/step-1/model.safetensors": b"at the root"}
    for key, data in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    return files


def test_no_credential_in_any_output_and_writes_stay_in_the_prefix(zygote, make_config, s3_bucket, moto, tmp_path):
    bucket = s3_bucket()
    s3 = S3View(moto.url, bucket, "", FAKE_KEY, FAKE_SECRET)
    # Neighbours in the bucket: other runs under the same prefix, and objects outside the prefix.
    neighbours_s3 = {"runs/test2/latest.json": b"{}", "runs/test2/ckpt/step-2/model.safetensors": b"other",
                     "runs/tes/ckpt/step-1/x": b"x", "runs/test.json": b"root", "test/latest.json": b"outside"}
    for key, data in neighbours_s3.items():
        s3.client.put_object(Bucket=bucket, Key=key, Body=data)
    local_store = tmp_path / "store"
    neighbours_local = _neighbours_local(local_store)

    url = f"s3://{bucket}/runs?endpoint={moto.url}"
    s3_cfg = make_config("s3.toml", store=url)
    local_cfg = make_config("local.toml", store=local_store, run_name="test")
    short = ["--set", "train.steps=4", "--set", "train.ckpt_every=1", "--set", "store.keep_last=1", "--no-progress"]
    outputs: dict[str, bytes] = {}

    def run(name: str, argv: list[str], expect: int, env: dict | None = None):
        r = zygote.run(argv, tmp_path / "out", env=env, timeout=180)
        outputs[f"{name} stdout"], outputs[f"{name} stderr"] = r.stdout.encode(), r.stderr.encode()
        assert r.returncode == expect, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
        return r

    # Whole runs on both stores (pruning included: keep_last=1, a checkpoint every step), export, sample.
    run("s3 train part", ["train", "-c", s3_cfg, *short, "--stop-after-steps", "2"], 0)
    run("s3 train rest", ["train", "-c", s3_cfg, *short], 0)
    run("s3 export", ["export", "-c", s3_cfg, "--out", str(tmp_path / "exported"), *short[:-1]], 0)
    run("sample", ["sample", "--from", str(tmp_path / "exported"), "--max-new-tokens", "4"], 0)
    # Every tracker at once, with their credentials in the environment (W&B offline: its files in the run folder).
    trackers = ["--set", 'log.backends=["tensorboard","wandb","mlflow"]', "--set",
                f"log.mlflow_uri=file://{tmp_path / 'mlruns'}", "--set", "train.eval_every=2"]
    tracker_env = {"WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_WANDB_KEY, "MLFLOW_ALLOW_FILE_STORE": "true",
                   "MLFLOW_TRACKING_USERNAME": "baton", "MLFLOW_TRACKING_PASSWORD": FAKE_MLFLOW_PASSWORD,
                   "MLFLOW_TRACKING_TOKEN": FAKE_MLFLOW_TOKEN}
    run("local train", ["train", "-c", local_cfg, *short, *trackers], 0, env=tracker_env)
    run("mlflow uri credentials", ["config", "-c", local_cfg, "--set",
                                   f"log.mlflow_uri=https://baton:{FAKE_MLFLOW_PASSWORD}@mlflow.invalid"], 2)
    run("config", ["config", "-c", s3_cfg], 0)
    # Failures that talk about the store or the URL.
    once = ["--set", "store.retries=1"]
    run("no bucket", ["train", "-c", s3_cfg, *short, *once,
                      "--set", f"store.url=s3://no-such-bucket-x/runs?endpoint={moto.url}"], 2)
    run("no server", ["train", "-c", s3_cfg, *short, *once,
                      "--set", "store.url=s3://b/runs?endpoint=http://127.0.0.1:9"], 2)
    run("url credentials", ["train", "-c", s3_cfg, "--set", f"store.url=s3://{FAKE_KEY}:{FAKE_SECRET}@{bucket}/r"], 2)
    run("endpoint credentials", ["config", "-c", s3_cfg, "--set",
                                 f"store.url=s3://{bucket}/r?endpoint=http://{FAKE_KEY}:{FAKE_SECRET}@127.0.0.1:9"], 2)
    assert "must not carry credentials" in outputs["url credentials stderr"].decode()

    everything = dict(outputs)
    everything.update(_tree(tmp_path / "runs"))
    everything.update(_tree(tmp_path / "exported"))
    everything.update(_tree(tmp_path / "mlruns"))
    assert any("/wandb/" in k and k.endswith(".wandb") for k in everything)  # the W&B run files were searched
    everything.update(_tree(local_store))
    everything.update({f"s3://{bucket}/{k}": s3.read(k) for k in s3.keys("")})
    assert len(everything) > 40
    assert _leaks({"probe": b"x" + FAKE_SECRET.encode()})  # the search itself works
    assert _leaks(everything) == []

    # Writes and deletes stayed inside each run's prefix: the neighbours are byte for byte as they were,
    # and everything else in the stores belongs to run 'test'.
    assert {k: s3.read(k) for k in neighbours_s3} == neighbours_s3
    assert all(k.startswith("runs/test/") for k in s3.keys("") if k not in neighbours_s3)
    assert {k: (local_store / k).read_bytes() for k in neighbours_local} == neighbours_local
    ours = [k for k in LocalView(local_store).keys("") if k not in neighbours_local]
    assert ours and all(k.startswith("test/") for k in ours)
    # Pruning ran (keep_last=1): of run 'test' only the newest checkpoint is left in each store.
    assert sorted({k.split("/")[2] for k in ours if k.startswith("test/ckpt/")}) == ["step-4"]
    assert sorted({k.split("/")[3] for k in s3.keys("runs/test/ckpt/")}) == ["step-4"]
    assert hashlib.sha256(s3.read("runs/test/latest.json")).hexdigest()  # the pointer is there
