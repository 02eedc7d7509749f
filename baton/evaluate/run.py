"""`baton eval`: one verified checkpoint scored on the run's held-out windows, extra files and lm-eval tasks.

The record goes to ``<run>/eval/<step>.json`` in the store (a text object beside, never inside, the
checkpoint folders) and into the model card `baton publish` writes.
"""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from ..config import Config, config_from_dict
from ..errors import BatonError
from ..hashing import sha256_file
from ..runtime.device import pick_device
from .heldout import Scorer, eval_micro_batch, file_rows, token_bytes
from .record import EvalRecord, eval_key, read_record, write_record

__all__ = ["EvalRecord", "Plan", "eval_key", "evaluate_model", "read_record", "run_eval", "write_record"]

class Plan:
    """What to evaluate, checked before any checkpoint is pulled."""

    def __init__(self, cfg: Config, files: list[str] | None = None, tasks: list[str] | None = None):
        from ..guard import input_path

        self.files = [input_path(f, "eval file", "fix eval.files or --files") for f in
                      (cfg.eval.files if files is None else files)]
        self.tasks = list(cfg.eval.tasks if tasks is None else tasks)
        names = [f.name for f in self.files]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the record and the card name each file's scores by its name
            raise BatonError(f"eval files share the name(s) {', '.join(twice)}: give each eval file its own name")
        self.field, self.task_dir, self.limit = cfg.eval.field, cfg.eval.task_dir, cfg.eval.limit
        self.tm = None
        if self.tasks:
            from .lmeval import task_manager

            self.tm = task_manager(self.tasks, cfg.eval.task_dir)

    def spec(self) -> dict[str, Any]:
        """What an evaluation by this plan scores, by content: a record is reused only for the same spec."""
        tasks: dict[str, Any] = {}
        if self.tasks:
            yamls = sorted(Path(self.task_dir).rglob("*.y*ml")) if self.task_dir else []
            tasks = {"names": self.tasks, "limit": self.limit, "task_dir": self.task_dir,
                     "task_files": {str(p.relative_to(self.task_dir)): sha256_file(p) for p in yamls}}
        return {"files": {f.name: sha256_file(f) for f in self.files},
                "field": self.field if any(f.suffix in (".jsonl", ".json") for f in self.files) else None,
                "tasks": tasks}


def evaluate_model(cfg: Config, plan: Plan, model: torch.nn.Module, step: int, config: dict[str, Any],
                   export_dir: Path | None) -> EvalRecord:
    """The record for ``model`` (the weights at ``step`` of a run trained by ``config``); ``export_dir`` its
    exported folder, needed for lm-eval tasks."""
    from ..data.reader import WindowDataset
    from ..data.tokenize import data_tokenizer, find_eos

    saved = config_from_dict(config)
    device = pick_device(cfg.train.device)
    model = model.to(device).eval()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(saved.train.precision)

    def autocast():
        return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()

    tok = data_tokenizer(cfg.data.dir)
    micro = eval_micro_batch(saved.train.micro_batch if isinstance(saved.train.micro_batch, int) else 1,
                             saved.data.seq_len, saved.model.vocab_size, dtype)
    scorer = Scorer(model, device, micro, autocast, token_bytes(tok))
    data = WindowDataset(cfg.data.dir, saved.data.seq_len, saved.data.shuffle_seed, saved.data.val_windows)
    ids = data.val_window_ids()
    heldout = scorer.score(data.windows(ids[a : a + micro]) for a in range(0, len(ids), micro))
    _, eos_id = find_eos(tok)
    files = {}
    for f in plan.files:
        files[f.name] = {**scorer.score(scorer.chunks(file_rows(f, tok, eos_id, saved.data.seq_len,
                                                                 cfg.eval.field))), "path": str(f)}
    tasks: dict[str, dict[str, float]] = {}
    if plan.tasks:
        if export_dir is None:
            raise BatonError("lm-eval tasks need the exported model folder")
        from .lmeval import run_tasks

        tasks = run_tasks(export_dir, plan.tasks, plan.tm, str(device), cfg.eval.limit)
    return EvalRecord(run=cfg.run.name, step=step, tokens_seen=step * saved.tokens_per_step, heldout=heldout,
                      files=files, tasks=tasks, evaluated=plan.spec())


def run_eval(cfg: Config, step: int | None = None, files: list[str] | None = None,
             tasks: list[str] | None = None) -> tuple[EvalRecord, str]:
    """Pull the verified checkpoint at ``step`` (None: the pointer's), evaluate it, write the record."""
    from ..data.manifest import load_manifest
    from ..data.prepare import TOKENIZER_FILE
    from ..model.export import checkpoint_model, export_model
    from ..store import RetryPolicy, check_write_access, open_store

    plan = Plan(cfg, files, tasks)
    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    check_write_access(store)  # the record is written last: a token that may only read is said before the work
    with tempfile.TemporaryDirectory(prefix="baton-eval-") as tmp:
        model, state = checkpoint_model(cfg, "store", Path(tmp), step)
        export_dir = None
        if plan.tasks:
            export_dir = export_model(model, Path(cfg.data.dir) / TOKENIZER_FILE, Path(tmp) / "export",
                                      load_manifest(cfg.data.dir)["tokenizer"]["eos_token"])
        record = evaluate_model(cfg, plan, model, state.step, state.config, export_dir)
    return record, write_record(store, record)
