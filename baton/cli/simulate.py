"""`baton simulate`: the relay on a simulated clock (``planning.simulate``, its inputs from ``views.simulate``),
printed as a table or JSON, with the finish-date CDF and the cadence curve drawn with ``--out``."""

from __future__ import annotations

import json

from .. import extras
from ..config import Config
from ..planning.charts import plot_cadence, plot_finish_cdf
from ..planning.simulate import cadence_curve, curve_minutes, simulate
from ..views.simulate import format_sim, sim_input, sim_options


def add_simulate_parser(sub, config_args) -> None:
    p = sub.add_parser("simulate", help="Monte Carlo of the relay with interruptions: finish date, GPU-hours, "
                       "sessions and steps lost as P10/P50/P90, and the checkpoint cadence")
    config_args(p, required=False)
    sim_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", default=None, metavar="DIR", help="also draw simulate-finish.png (and, with --curve, "
                   "simulate-cadence.png) into DIR")


def run_simulate(args, cfg: Config | None) -> int:
    out_dir = None
    if args.out:  # the place first: a refused --out is said before any input is read
        from ..guard import output_dir

        out_dir = output_dir(args.out, "--out", cfg, force=True, own=("the run folder",))
    si, src = sim_input(args, cfg)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    r = simulate(si)
    curve = None
    if args.curve:
        from dataclasses import replace

        curve = cadence_curve(replace(si, runs=min(si.runs, 500)), curve_minutes(si))
    drawn = out_dir is not None and extras.plotting("the simulator plots")
    if drawn:
        assert out_dir is not None
        plot_finish_cdf(r.finish, out_dir / "simulate-finish.png", si.plan.deadline, r.baseline.eta)
        if curve:
            plot_cadence(curve, si.plan.ckpt_every_s / 60, out_dir / "simulate-cadence.png")
    if args.json:
        print(json.dumps(r.to_dict() | {"sources": src, "curve": curve}, indent=1))
        return 0
    print(format_sim(r, src, curve))
    if drawn:
        assert out_dir is not None
        print(f"\nplots: {out_dir / 'simulate-finish.png'}" + (f", {out_dir / 'simulate-cadence.png'}" if curve else ""))
    return 0
