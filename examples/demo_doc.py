"""Write docs/quickstart.md from a real run of the demo: its output, block by block, each under a sentence
that says what the block shows. Run it again after changing the demo or what its commands print:

    python examples/demo_doc.py [--out docs/quickstart.md] [demo.py's --set KEY=VALUE ...]

It runs examples/demo.py from the repository root (the demo's folders under demo/ are made afresh) and
writes the page only when the demo succeeded.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = re.compile(r"^={20,}\n (\d)/6  (.*)\n={20,}\n", re.M)

# One sentence per block, in the demo's order: what a reader should take from it.
EXPLAIN = [
    "`baton prepare --publish` tokenizes the Python standard library's sources with a byte-level BPE it trains "
    "on them, and publishes the shards, tokenizer and manifest to `demo/remote/data`, where any later machine "
    "pulls them from (see [the relay on fresh machines](relay.md)).",
    "`baton plan` splits the run into sessions that fit a platform's session limit and a quota, with their "
    "calendar and billed GPU-hours; `baton simulate` replays that relay with sessions cut at random and gives "
    "the finish, the hours and the steps lost as percentiles (see [planning](planning.md) and "
    "[simulate](simulate.md)).",
    "Session 1 gets SIGTERM halfway, as a spot VM's preemption or a notebook's quota end sends it: it finishes "
    "the step it is in, pushes a checkpoint, verifies it in the store, rolls the pointer and exits 0 (see "
    "[failure behaviour](failures.md)).",
    "The machine's disk is deleted; the same `baton train` on the empty machine pulls the dataset and the "
    "checkpoint the pointer names, resumes at that step and trains to the horizon. The lines after it are "
    "the demo's own check, read from the ledger and the final checkpoint's per-step metrics: the second "
    "session began exactly where the first one's verified checkpoint ended, and every step ran once.",
    "`baton status`, `baton ledger` and `baton report` read the store alone, so they work from any machine: "
    "where the run is, each session's billed hours and how it ended, and a report with plots of the loss, "
    "the sessions and the throughput (see [monitoring](monitoring.md)).",
    "`baton eval` scores the final checkpoint on held-out windows the run never trained on, in bits per byte "
    "so that tokenizers compare; a model that learned nothing scores log2 of the vocabulary per token. The "
    "sample comes from the exported Hugging Face folder (`from_pretrained` loads it).",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "quickstart.md"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    opts = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # other work on the cores slows the demo
    cmd = [sys.executable, str(ROOT / "examples" / "demo.py"), *(a for kv in opts.set for a in ("--set", kv))]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                          os.environ.get("PYTHONPATH")]))})
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        print(f"demo_doc: the demo exited {done.returncode}; {opts.out} is unchanged", file=sys.stderr)
        return 1
    Path(opts.out).write_text(page(done.stdout, load))
    print(f"demo_doc: wrote {opts.out}")
    return 0


def page(output: str, load: float | None = None) -> str:
    parts = HEADER.split(output)  # [before, n, title, body, n, title, body, ...]
    blocks = [(int(parts[i]), parts[i + 1], parts[i + 2]) for i in range(1, len(parts), 3)]
    if [n for n, _, _ in blocks] != list(range(1, len(EXPLAIN) + 1)):
        raise SystemExit(f"demo_doc: the demo printed blocks {[n for n, _, _ in blocks]}, not 1 to {len(EXPLAIN)}")
    params = re.search(r"\(([\d,]+) parameters\)", output)
    size = f"a {int(params.group(1).replace(',', '')) / 1e6:.1f} M-parameter" if params else "a small"
    machine = f"{os.cpu_count()} CPU cores ({platform.machine()}), Python {platform.python_version()}"
    if load is not None:
        machine += f", load average {load:.1f} when it began (other work on the cores lengthens every time below)"
    out = ["# Quick start: what `make demo` shows", "",
           "<!-- Written by examples/demo_doc.py from a real run of the demo; run it again rather than editing "
           "the output below. -->", "",
           "`make demo` installs baton into `.venv` and runs `examples/demo.py`: one small run of "
           f"`configs/demo.toml` ({size} Llama on the Python standard library's sources, a local "
           "folder as the store) told as the relay baton is for. Each block below is its output, unedited, "
           f"from a run on {machine}; the demo's folders live under `demo/`, and every command in it can be "
           "run again by hand.", ""]
    for (n, title, body), sentence in zip(blocks, EXPLAIN):
        out += [f"## {n}. {title[0].upper()}{title[1:]}", "", sentence, "", "```", body.strip("\n"), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
