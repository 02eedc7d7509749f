"""Kill anywhere: SIGKILL at random moments of every phase, over the local store and the S3 test server.

The harness (chaos.py) checks every invariant after every kill with its own reader of the store; the
long version is benchmarks/chaos_long.py (200 kills).
"""

from __future__ import annotations

import random

from support.chaos import AIMED, PHASES, Chaos, LocalView, S3View, compare_runs
from support.fake_credentials import FAKE_KEY, FAKE_SECRET

CADENCE = 2
STEPS = 48
KILLS_PER_STORE = 12


def _targets(rng: random.Random) -> list[str]:
    # Every aimed point once, in a random order, and random-time kills among them.
    t = list(AIMED) + ["random"] * 3
    rng.shuffle(t)
    return t


def test_sigkill_at_random_moments_keeps_every_invariant(zygote, make_config, s3_bucket, moto, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    common = [f"train.steps={STEPS}", f"train.ckpt_every={CADENCE}"]
    local_cfg = make_config("local.toml", store=tmp_path / "store")
    bucket = s3_bucket()
    s3_cfg = make_config("s3.toml", store=f"s3://{bucket}/runs?endpoint={moto.url}")
    runs = tmp_path / "runs"
    local_view = LocalView(tmp_path / "store")
    s3_view = S3View(moto.url, bucket, "runs", FAKE_KEY, FAKE_SECRET)
    lines: list[str] = []

    # The uninterrupted run every chaotic one must equal.
    ref = zygote.run(["train", "-c", local_cfg, "--no-progress", "--set", "run.name=ref",
                      *sum((["--set", o] for o in common), [])], tmp_path / "out")
    assert ref.returncode == 0, ref.stderr[-3000:]

    # Local store with background pushes (the default), S3 with synchronous ones. Either way at most one
    # cadence is redone: a checkpoint whose push the kill cut short is still on this disk, and the next
    # session finishes that push before it resumes.
    plans = [("local", local_cfg, local_view, True, 1), ("s3", s3_cfg, s3_view, False, 1)]
    kills, violations, hits = [], [], set()
    for name, cfg, view, background, bound in plans:
        chaos = Chaos(zygote, cfg, view, tmp_path / name, runs, CADENCE, bound, rng,
                      common + [f"store.async_push={'true' if background else 'false'}"],
                      pause=0.2, random_window=(0.3, 1.2), log=lines.append)
        r = 0
        # A round may end with few kills (a session can finish before a random moment comes): more rounds, not
        # fewer kills, so the count does not depend on the machine's speed.
        while len(chaos.report.kills) < KILLS_PER_STORE and r < 6:
            run = f"{name}-{r}"
            chaos.round(run, KILLS_PER_STORE - len(chaos.report.kills), _targets(rng))
            chaos.report.violations += compare_runs(local_view, "ref", runs, view, run, runs)
            r += 1
        kills += chaos.report.kills
        violations += chaos.report.violations
        hits |= {k.hit.split(".")[0].rstrip("+") for k in chaos.report.kills}

    detail = f"seed {seed}\n" + "\n".join(lines)
    assert violations == [], "\n".join(violations) + "\n" + detail
    assert len(kills) >= 20, detail
    assert all(k.status == -9 for k in kills)
    assert set(PHASES) <= hits, f"phases never hit: {set(PHASES) - hits}\n{detail}"
    # Kills after a pointer existed really did resume from it (not from step 0) and were followed by
    # progress: every run ended complete and equal to the reference (compare_runs above).
    assert any(k.pointer_before for k in kills)
