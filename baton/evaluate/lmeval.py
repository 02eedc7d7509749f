"""lm-evaluation-harness tasks on an exported model folder, through its Python API (the optional `eval` extra).

Tasks are found by name among the harness's own and the YAML files of ``eval.task_dir`` (offline use: a
task over a local text or JSONL file). Names are checked before anything is pulled or uploaded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import extras
from ..errors import BatonError

log = logging.getLogger(__name__)


def task_manager(names: list[str], task_dir: str = ""):
    """A TaskManager that knows every name in ``names``; a missing package or an unknown task is a BatonError."""
    TaskManager = extras.require("lm_eval.tasks", "eval tasks (eval.tasks, --tasks)").TaskManager
    if task_dir and not Path(task_dir).is_dir():
        raise BatonError(f"eval.task_dir {task_dir} is not a folder (it holds the local task YAML files)")
    # Indexing the harness's thousands of task files takes seconds: tasks all found in task_dir skip it.
    tm = TaskManager(include_path=task_dir, include_defaults=False) if task_dir else None
    if tm is None or any(n not in tm.all_tasks for n in names):
        tm = TaskManager(include_path=task_dir or None)
    unknown = [n for n in names if n not in tm.all_tasks]
    if unknown:
        where = f" or in {task_dir}" if task_dir else " (local task YAML files go in eval.task_dir)"
        raise BatonError(f"lm-eval task(s) {', '.join(unknown)} not found among the harness's tasks{where}")
    return tm


def run_tasks(folder: Path, names: list[str], tm, device: str, limit: int = 0) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for the exported model in ``folder``; standard errors and aliases dropped."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(folder), device=device, batch_size=1)
    with _no_git_probe():
        res = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=tm, limit=limit or None, log_samples=False)
    out: dict[str, dict[str, float]] = {}
    for task, metrics in (res or {}).get("results", {}).items():
        out[task] = {metric_name(k): float(v) for k, v in metrics.items()
                     if "_stderr" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)
                     and k != "sample_len" and math.isfinite(float(v))}
    return out


def metric_name(key: str) -> str:
    """lm-eval's ``metric,filter`` as the record names it: the metric, with its filter unless that is ``none``
    (gsm8k's ``exact_match,strict-match`` and ``exact_match,flexible-extract`` are two numbers, not one)."""
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else f"{metric} ({filt})"


@contextmanager
def _no_git_probe() -> Iterator[None]:
    """Skip the harness's `git describe` of the working folder while it evaluates.

    It records the git commit of whatever folder baton runs in (not of the model or the tasks; the record
    here drops it), and outside a git checkout git prints "fatal: not a git repository" straight onto the
    user's terminal. Everything else the harness reports still reaches the terminal.
    """
    import lm_eval.evaluator as evaluator

    probe = getattr(evaluator, "get_git_commit_hash", None)
    if probe is None:  # a harness version without the probe
        yield
        return
    evaluator.get_git_commit_hash = lambda: None
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = probe
