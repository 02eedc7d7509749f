"""Chaos, long version: 200 SIGKILLs at random moments over the local store and an S3 server, every invariant
checked after every kill; prints the count of invariant violations (the target is 0).

It trains the embedded default (configs/tiny.toml, with a checkpoint every 2 steps so that every phase of
the checkpoint cycle comes round often) in four arrangements: {local store, S3 test server} x {background
push (the default), synchronous push}, a quarter of the kills each. Each run is killed, resumed, killed
again until it completes; each completed run must equal an uninterrupted one exactly (weights, optimizer
moments, metrics, validation loss). The harness and the invariants are tests/support/chaos.py; the
bounded version of this is tests/reliability/test_chaos.py.

Requirements: the test extras (``pip install -e '.[test]'``: boto3, moto[server]).
Run: ``python benchmarks/chaos_long.py`` (``--kills 40 --small`` for a quick look with the test model).
On two shared CPU cores a kill costs 10-30 s with tiny.toml (start-up, a 29 MB pull, up to a cadence
of steps), so 200 kills take an hour or more; ``--small`` (the test suite's model) does 200 in about 4 min.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.chaos import AIMED, PHASES, Chaos, LocalView, S3View, compare_runs  # noqa: E402
from support.zygote import Zygote  # noqa: E402

KEY, SECRET = "AKIDBATONCHAOSLONG01", "batonChaosLongFakeSecret"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=200, help="SIGKILLs in all (default 200)")
    ap.add_argument("--small", action="store_true", help="the test suite's model and corpus instead of tiny.toml")
    ap.add_argument("--steps", type=int, default=0, help="horizon of each run (default: 120, or 48 with --small)")
    ap.add_argument("--cadence", type=int, default=2, help="train.ckpt_every")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--work", default=None, help="working folder (default: a fresh temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    args = ap.parse_args()

    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="baton-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (48 if args.small else 120)
    print(f"chaos_long: {args.kills} kills, seed {seed}, {'test model' if args.small else 'configs/tiny.toml'}, "
          f"{steps} steps, checkpoint every {args.cadence}, work {work}", flush=True)

    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(work / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(work / "none")}
    unset = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
    os.environ.update(env)
    for k in unset:
        os.environ.pop(k, None)

    from support.store_servers import MotoServer

    zygote, moto = Zygote(env=env, unset=unset), MotoServer().start()
    t_start = time.time()
    try:
        config = _config(work, args.small)
        data = work / "data"
        common = [f"data.dir={data}", f"run.local_dir={work / 'runs'}", f"train.steps={steps}",
                  f"train.ckpt_every={args.cadence}", "train.device=cpu"]
        sets = [a for o in common for a in ("--set", o)]
        t = time.time()
        r = zygote.run(["prepare", "-c", config, "--no-progress", *sets[:2]], work / "out", timeout=3600)
        if r.returncode:
            print(r.stderr[-3000:])
            return 2
        print(f"data prepared in {time.time() - t:.0f} s", flush=True)

        local_view = LocalView(work / "local-store")
        s3_view = S3View(moto.url, "chaos", "runs", KEY, SECRET)
        s3_view.client.create_bucket(Bucket="chaos")
        t = time.time()
        r = zygote.run(["train", "-c", config, "--no-progress", *sets, "--set", f"store.url={work / 'local-store'}",
                        "--set", "run.name=reference"], work / "out", timeout=7200)
        if r.returncode:
            print(r.stderr[-3000:])
            return 2
        print(f"uninterrupted reference run: {time.time() - t:.0f} s", flush=True)

        arrangements = [("local", work / "local-store", local_view, True), ("local", work / "local-store", local_view,
                        False), ("s3", f"s3://chaos/runs?endpoint={moto.url}", s3_view, True),
                        ("s3", f"s3://chaos/runs?endpoint={moto.url}", s3_view, False)]
        total_violations, all_kills, rounds = [], [], 0
        per = [args.kills // 4 + (1 if i < args.kills % 4 else 0) for i in range(4)]
        for (name, url, view, background), want in zip(arrangements, per):
            label = f"{name}/{'background' if background else 'synchronous'} push"
            chaos = Chaos(zygote, Path(config), view, work / f"w-{name}-{background}", work / "runs", args.cadence,
                          1, rng,
                          common + [f"store.url={url}", f"store.async_push={'true' if background else 'false'}"],
                          pause=0.25, random_window=(0.5, 4.0) if not args.small else (0.3, 1.5))
            r_i, t = 0, time.time()
            while len(chaos.report.kills) < want and r_i < want:
                run = f"{name}-{'bg' if background else 'sync'}-{r_i}"
                targets = list(AIMED) + ["random"] * 4
                rng.shuffle(targets)
                chaos.round(run, want - len(chaos.report.kills), targets)
                chaos.report.violations += compare_runs(local_view, "reference", work / "runs", view, run,
                                                        work / "runs")
                r_i += 1
            rounds += chaos.report.rounds_completed
            hits = collections.Counter(k.hit.split(".")[0].rstrip("+") for k in chaos.report.kills)
            print(f"{label:28s} kills {len(chaos.report.kills):4d}  sessions {chaos.report.legs:4d}  runs completed "
                  f"{chaos.report.rounds_completed}  violations {len(chaos.report.violations)}  "
                  f"{time.time() - t:.0f} s  phases: " + ", ".join(f"{p} {hits.get(p, 0)}" for p in
                                                                    (*PHASES, "startup")), flush=True)
            for v in chaos.report.violations:
                print(f"  VIOLATION {v}")
            total_violations += chaos.report.violations
            all_kills += chaos.report.kills
        missing = set(PHASES) - {k.hit.split(".")[0].rstrip("+") for k in all_kills}
        print(f"kills {len(all_kills)}, completed runs {rounds}, phases never hit: {sorted(missing) or 'none'}, "
              f"{time.time() - t_start:.0f} s")
        print(f"invariant violations: {len(total_violations)}")
        return 0 if not total_violations and len(all_kills) >= args.kills and not missing else 1
    finally:
        zygote.close()
        moto.stop()
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)


def _config(work: Path, small: bool) -> str:
    if not small:
        return str(ROOT / "configs" / "tiny.toml")
    from support.helpers import write_config

    return str(write_config(work / "small.toml", data_dir=work / "data", store=work / "local-store",
                            runs=work / "runs", run_name="small"))


if __name__ == "__main__":
    sys.exit(main())
