"""The dataset relay against its floor: publish to and pull from the S3 test server (moto).

1. pull: ``baton.data.pull.ensure_data`` into an empty folder (listing, parallel streamed downloads to a
   temporary name, sha256 of every file against the manifest, fsync, rename, manifest last) against plain
   parallel GETs of the same objects (boto3, same number of threads, streamed to files) plus one sha256
   pass over them. Target: baton's throughput / the floor's >= 0.7.
2. publish: ``baton.data.publish.publish`` (local sha256 pass, parallel uploads with the sha256 checksum,
   listing with size + sha256, ranged read-backs, manifest written last and read back) against plain
   parallel PUTs of the same files plus one sha256 pass. Target >= 0.7.

Both sides run in this process against the same server, interleaved round by round (the machine may be
shared and loaded); the medians are compared. The dataset is synthetic: shards of random uint16 tokens in
baton's shard format with a consistent manifest, ``--mb`` in all.

Requirements: baton's test extra (moto[server], boto3). Run: ``python benchmarks/bench_data_pull.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "store"))

import numpy as np  # noqa: E402

from baton.config import load_config  # noqa: E402
from baton.data.manifest import FORMAT, MANIFEST, corpus_fingerprint  # noqa: E402
from baton.data.publish import publish  # noqa: E402
from baton.data.pull import ensure_data  # noqa: E402
from baton.data.shards import write_shard  # noqa: E402
from baton.hashing import sha256_file  # noqa: E402

CHUNK = 8 << 20


def make_dataset(folder: Path, mb: int, shard_mb: int) -> int:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    shards, left, i = [], mb << 20, 0
    while left > 0:
        n = min(shard_mb << 20, left) // 2
        name = f"shard-{i:05d}.bin"
        digest = write_shard(folder / name, rng.integers(0, 65535, n, dtype=np.uint16))
        shards.append({"file": name, "sha256": digest, "tokens": n, "sources": [0]})
        left -= n * 2
        i += 1
    (folder / "tokenizer.json").write_text(json.dumps({"model": "synthetic"}), encoding="utf-8")
    tok = sha256_file(folder / "tokenizer.json")
    m = {"format": FORMAT, "dtype": "uint16", "tokenizer": {"file": "tokenizer.json", "sha256": tok, "vocab_size": 65535},
         "shards": shards, "n_shards": len(shards), "total_tokens": sum(s["tokens"] for s in shards),
         "fingerprint": corpus_fingerprint(shards, tok, "uint16")}
    (folder / MANIFEST).write_text(json.dumps(m, indent=2), encoding="utf-8")
    return sum(p.stat().st_size for p in folder.iterdir())


def floor_pull(client, bucket: str, prefix: str, names: list[str], out: Path, workers: int) -> float:
    out.mkdir(parents=True)
    t0 = time.perf_counter()

    def get(name: str) -> None:
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"]
        with open(out / name, "wb") as f:
            for chunk in body.iter_chunks(CHUNK):
                f.write(chunk)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(get, names))
        list(pool.map(lambda n: sha256_file(out / n), names))
    seconds = time.perf_counter() - t0
    shutil.rmtree(out)
    return seconds


def floor_publish(client, bucket: str, prefix: str, src: Path, workers: int) -> float:
    names = sorted(p.name for p in src.iterdir())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: sha256_file(src / n), names))

        def put(name: str) -> None:
            with open(src / name, "rb") as f:
                client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=f)

        list(pool.map(put, names))
    return time.perf_counter() - t0


def clear(client, bucket: str, prefix: str) -> None:
    keys = [{"Key": o["Key"]} for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
    if keys:
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="size of the dataset in MiB")
    ap.add_argument("--shard-mb", type=int, default=16, help="size of one shard in MiB")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each side, interleaved")
    ap.add_argument("--workers", type=int, default=4, help="parallel transfers on both sides (data.transfer_workers)")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary folder)")
    args = ap.parse_args()

    import boto3
    from botocore.config import Config

    from support.store_servers import MotoServer

    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    server = MotoServer().start()
    base = Path(tempfile.mkdtemp(prefix="baton-bench-data-", dir=args.dir))
    try:
        src = base / "prepared"
        size = make_dataset(src, args.mb, args.shard_mb)
        names = sorted(p.name for p in src.iterdir())
        client = boto3.client("s3", endpoint_url=server.url, config=Config(s3={"addressing_style": "path"},
                                                                          max_pool_connections=32))
        client.create_bucket(Bucket="bench")
        print(f"dataset: {size:,} bytes ({size / 1e6:.0f} MB) in {len(names)} files; {args.workers} transfers at "
              f"once; {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
              f"python {platform.python_version()}")

        def cfg(prefix: str, data_dir: Path):
            return load_config(None, [f"data.dir={data_dir}", f"data.url=s3://bench/{prefix}?endpoint={server.url}",
                                      f"store.url={base / 'store'}", f"run.local_dir={base / 'runs'}",
                                      f"data.transfer_workers={args.workers}"])

        pub = {"baton": [], "floor": []}
        pull = {"baton": [], "floor": []}
        def baton_publish() -> None:
            clear(client, "bench", "relay")
            t0 = time.perf_counter()
            rep = publish(cfg("relay", src))
            pub["baton"].append(time.perf_counter() - t0)
            assert rep.uploaded == len(names) - 1

        def plain_publish() -> None:
            clear(client, "bench", "plain")
            pub["floor"].append(floor_publish(client, "bench", "plain", src, args.workers))

        def baton_pull() -> None:
            t0 = time.perf_counter()
            got = ensure_data(cfg("relay", base / "pulled"))
            pull["baton"].append(time.perf_counter() - t0)
            assert got.pulled_files == len(names) - 1
            shutil.rmtree(base / "pulled")
            shutil.rmtree(base / "runs", ignore_errors=True)

        def plain_pull() -> None:
            pull["floor"].append(floor_pull(client, "bench", "relay", names, base / "floor-pull", args.workers))

        for r in range(args.rounds):
            # Sides alternate which goes first, so neither always meets a warmer server or page cache.
            order = [plain_publish, baton_publish] if r % 2 == 0 else [baton_publish, plain_publish]
            order += [baton_pull, plain_pull] if r % 2 == 0 else [plain_pull, baton_pull]
            for side in order:
                side()
            print(f"  round {r + 1}: publish baton {pub['baton'][-1]:.2f} s, floor {pub['floor'][-1]:.2f} s; "
                  f"pull baton {pull['baton'][-1]:.2f} s, floor {pull['floor'][-1]:.2f} s")
        for what, t in (("pull", pull), ("publish", pub)):
            b, f = statistics.median(t["baton"]), statistics.median(t["floor"])
            print(f"{what}: baton {size / 1e6 / b:.0f} MB/s, plain parallel + one sha256 pass {size / 1e6 / f:.0f} "
                  f"MB/s: ratio {f / b:.2f} (target >= 0.7)")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
