"""One training session on a spot (preemptible) VM: resume from the store, train until the VM is reclaimed
or the time is up, and leave a verified checkpoint in the store.

A reclaimed VM gets SIGTERM shortly before it goes (GCP: about 30 s after the preemption notice, through
the guest's shutdown; AWS: at shutdown, 2 minutes after the interruption notice). baton.train handles
SIGTERM itself: the current step ends, the checkpoint is pushed and verified, and train() returns, so this
script exits 0. Start it at boot (a systemd unit with ``TimeoutStopSec`` longer than one checkpoint, or
``@reboot`` in cron) and every new VM continues the run where the last one stopped.

    python spot_vm.py --config run.toml --nproc 2 --session-hours 24
    python spot_vm.py --smoke            # a tiny CPU run end to end, with the examples' smoke.toml

Store credentials come from the environment (HF_TOKEN, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import baton

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="run.toml", help="baton config (TOML)")
    p.add_argument("--smoke", action="store_true", help="train examples/smoke.toml on the CPU, under --work-dir")
    p.add_argument("--work-dir", default=".", help="SMOKE: folder for data, store and runs")
    p.add_argument("--data-dir", default="", help="a prepared data folder (default: data.dir of the config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, as in baton train (repeatable)")
    p.add_argument("--nproc", type=int, default=1, help="processes, one per GPU")
    p.add_argument("--session-hours", default=None, help="a limit of the VM's own (e.g. a reservation), if any")
    args = p.parse_args(argv)

    overrides = []
    if args.smoke:
        work = Path(args.work_dir).resolve()
        overrides += [f"data.dir={work / 'data' / 'smoke'}", f"store.url={work / 'store'}",
                      f"run.local_dir={work / 'runs'}"]
    if args.data_dir:
        overrides.append(f"data.dir={args.data_dir}")
    try:
        cfg = baton.load_config(HERE / "smoke.toml" if args.smoke else args.config, [*overrides, *args.overrides])
        if not (Path(cfg.data.dir) / "manifest.json").exists():
            baton.prepare(cfg, progress=False)
        summary = baton.train(cfg, nproc=args.nproc, session_hours=args.session_hours, progress=False)
        st = baton.status(cfg)
    except baton.BatonError as e:
        print(f"baton: error: {e}", file=sys.stderr)
        return 2
    print(f"session ended at step {summary['steps_done']} of {summary['total_steps']}"
          f"{' on ' + summary['stopped_by'] if summary.get('stopped_by') else ''}; "
          f"verified checkpoint in the store: step {st['pointer_step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
