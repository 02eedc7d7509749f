"""One training session: the components the loop calls, built before it and torn down after it.

A session resumes from the store on its own, trains to a stop boundary, and hands on the baton through
the verified checkpoint cycle. Every rank runs the same code; only rank 0 talks to the store, and every
decision that ends the session (stop step, signal, failed push) is agreed by all ranks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import dist
from .checkpoint import state as ckstate
from .checkpoint.cycle import POINTER, PushResult, make_pointer, push_checkpoint, push_folder, write_pointer
from .checkpoint.resume import pull_checkpoint, read_pointer
from .config import Config, config_from_dict
from .data.prepare import TOKENIZER_FILE
from .data.reader import Cursor, WindowDataset
from .errors import BatonError, ConfigError, ResumeError, StoreError
from .model import build_model, count_parameters, param_count
from .store import Store, open_store
from .versions import versions

log = logging.getLogger(__name__)

# Shape and data settings whose change would make the resumed run a different run.
FROZEN_KEYS = ("model.n_layers", "model.hidden", "model.n_heads", "model.n_kv_heads", "model.ffn",
               "model.vocab_size", "model.tie_embeddings", "model.rope_theta", "data.seq_len",
               "data.shuffle_seed", "data.val_windows", "train.global_batch")


@dataclass
class Stats:
    """Counters that travel in the checkpoint so a resumed run reports whole-run totals."""

    nonfinite_skips: int = 0
    consecutive_nonfinite: int = 0
    last_loss: float | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)


class Session:
    def __init__(self, cfg: Config, resume: str = "auto", stop_after: int | None = None, progress: bool = True):
        self.cfg = cfg
        self.resume_mode = resume
        self.progress_enabled = progress
        self.t_start = time.time()
        self.device = _pick_device(cfg.train.device)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.dist = dist.init(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        self.run = cfg.run.name
        self.run_dir = cfg.run_dir
        from . import logs

        logs.setup(self.dist.rank, self.run_dir / "logs")
        self.total_steps = cfg.total_steps
        self.stop_step = min(stop_after, self.total_steps) if stop_after is not None else self.total_steps
        self.world = self.dist.world
        if cfg.train.global_batch % (cfg.train.micro_batch * self.world):
            raise ConfigError(
                f"train.global_batch={cfg.train.global_batch} is not divisible by micro_batch "
                f"{cfg.train.micro_batch} x {self.world} ranks (change micro_batch or the number of ranks)"
            )
        self.accum = cfg.train.global_batch // (cfg.train.micro_batch * self.world)
        self.store: Store = open_store(cfg.store.url)
        self.data = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
        if self.data.vocab_size > cfg.model.vocab_size:
            raise ConfigError(
                f"the tokenizer in {cfg.data.dir} has {self.data.vocab_size} tokens but model.vocab_size is "
                f"{cfg.model.vocab_size} (raise model.vocab_size to at least {self.data.vocab_size})"
            )
        self.model = build_model(cfg.model, self.device, seed=cfg.train.seed)
        self.n_params = count_parameters(self.model)
        if self.n_params != param_count(cfg.model):
            raise RuntimeError(f"built model has {self.n_params} parameters, closed form says {param_count(cfg.model)}")
        self.optimizer = _adamw(self.model, cfg, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.train.precision == "fp16")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
        self._assert_precision()
        self.step = 0
        self.stats = Stats()
        self.resumed_from: int | None = None
        self.complete_pointer: dict[str, Any] | None = None
        self.session_checkpoints: list[dict[str, Any]] = []
        self.peak_train = 0
        self.peak_eval = 0
        self.val: dict[str, float] | None = None
        self._stop_signal: int | None = None
        self._last_ckpt_step: int | None = None
        self._resume()
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.model = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._tb = _tensorboard(self.run_dir) if self.dist.is_main else None
        self._install_signals()
        self._bar = None

    # ------------------------------------------------------------------------------------- resume
    def _resume(self) -> None:
        cfg = self.cfg
        if self.resume_mode == "never":
            pointer = read_pointer(self.store, self.run) if self.dist.is_main else None
            if dist.broadcast(pointer is not None):
                raise BatonError(
                    f"{self.store.describe()} already holds run {self.run!r} at step {pointer['step'] if pointer else '?'}; "
                    "use --resume auto to continue it, or set a new run.name"
                )
            log.info("--resume never: starting run %r at step 0", self.run)
            return
        if self.resume_mode == "auto":
            # Only rank 0 reads the store; the answer (or the error) is shared so every rank agrees.
            pointer, err = None, None
            if self.dist.is_main:
                try:
                    pointer = read_pointer(self.store, self.run)
                except BatonError as e:
                    err = str(e)
            pointer, err = dist.broadcast((pointer, err))
            if err:
                raise ResumeError(err)
            if pointer is None:
                log.info("no checkpoint pointer %s/%s in %s: starting run %r at step 0",
                         self.run, POINTER, self.store.describe(), self.run)
                return
            if pointer.get("complete") and pointer["step"] >= self.total_steps:
                self.complete_pointer = pointer
                return
            log.info("auto-resume: %s says step %d at %s/%s", self.store.describe(), pointer["step"], self.run,
                     pointer["path"])
            folder = self.run_dir / "resume" / f"step-{pointer['step']}"
            err = None
            if self.dist.local_rank == 0:
                try:
                    pull_checkpoint(self.store, self.run, pointer, folder)
                except BatonError as e:
                    err = str(e)
            errs = [e for e in dist.gather(err) if e]
            if errs:
                raise ResumeError(errs[0])
        else:
            folder = Path(self.resume_mode)
            if not folder.is_dir():
                raise BatonError(f"--resume {folder}: no such checkpoint folder (use auto, never or a folder)")
        st = ckstate.read_state(folder)
        self._check_drift(st)
        ckstate.load_checkpoint(folder, self.model, self.optimizer)
        cursor = Cursor.from_dict(st["cursor"])
        self.data.check_cursor(cursor)
        if cursor.samples_consumed != st["step"] * cfg.train.global_batch:
            raise ResumeError(f"cursor has {cursor.samples_consumed} samples at step {st['step']}, expected "
                              f"{st['step'] * cfg.train.global_batch}")
        self.step = st["step"]
        self.resumed_from = self.step
        if st.get("scaler"):
            self.scaler.load_state_dict(st["scaler"])
        ranks = st["rng"]["ranks"]
        if len(ranks) == self.world:
            ckstate.set_rng_state(ranks[self.dist.rank])
        else:
            log.warning("checkpoint was written by %d ranks, this run has %d: reseeding RNGs deterministically",
                        len(ranks), self.world)
            torch.manual_seed(cfg.train.seed + 1_000_003 * self.step + self.dist.rank)
        self.stats = Stats(**{k: v for k, v in st.get("stats", {}).items() if k in Stats.__dataclass_fields__})
        if self.dist.is_main and (folder / ckstate.METRICS_FILE).is_file():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # Lines past the checkpoint belong to work that was lost with the previous session.
            (self.run_dir / "metrics.jsonl").write_bytes((folder / ckstate.METRICS_FILE).read_bytes())
        log.info("resumed at step %d (samples consumed %d)", self.step, cursor.samples_consumed)

    def _check_drift(self, st: dict[str, Any]) -> None:
        old = config_from_dict(st["config"]).to_dict()
        new = self.cfg.to_dict()
        diffs = []
        for key in FROZEN_KEYS:
            sec, name = key.split(".")
            if old[sec][name] != new[sec][name]:
                diffs.append(f"{key}: checkpoint {old[sec][name]!r}, now {new[sec][name]!r}")
        if diffs:
            raise ResumeError("the config changed in ways that make this a different run: " + "; ".join(diffs)
                              + " (restore those settings, or start a new run.name)")

    # -------------------------------------------------------------------------------- the step
    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def no_sync(self, last_micro: bool):
        # Gradients are all-reduced once per optimizer step, on the last micro-batch only.
        if self.world > 1 and not last_micro:
            return self.model.no_sync()
        return nullcontext()

    def micro_batches(self, step: int):
        for x, y in self.data.rank_micro_batches(step, self.cfg.train.global_batch, self.cfg.train.micro_batch,
                                                 self.dist.rank, self.world):
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _assert_precision(self) -> None:
        bad = [n for n, p in self.model.named_parameters() if p.dtype != torch.float32]
        if bad:
            raise RuntimeError(f"master weights must be fp32; {bad[:3]} are not")
        if self.scaler.is_enabled() != (self.cfg.train.precision == "fp16"):
            raise RuntimeError("GradScaler must be enabled exactly when precision is fp16")

    # ----------------------------------------------------------------------------- stop signals
    def _install_signals(self) -> None:
        def handler(signum, frame):
            if self._stop_signal is not None:
                # Second signal: the user (or platform) means now.
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self._stop_signal = signum
            log.warning("received %s: will checkpoint at the next step boundary and exit",
                        signal.Signals(signum).name)

        self._old_handlers = {}
        try:
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                self._old_handlers[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread (embedded use): no signal handling
            self._old_handlers = {}

    def stop_requested(self) -> bool:
        return dist.any_true(self._stop_signal is not None, self.device)

    # ---------------------------------------------------------------------------- bookkeeping
    def record(self, step: int, m: dict[str, Any]) -> None:
        self.step = step
        self.stats.last_loss = m["loss"]
        if self.device.type == "cuda":
            self.peak_train = max(self.peak_train, torch.cuda.max_memory_allocated(self.device))
        else:
            self.peak_train = _rss_peak()
        if not self.dist.is_main:
            return
        row = {"step": step, **m, "samples_consumed": step * self.cfg.train.global_batch}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k in ("loss", "lr", "grad_norm", "tokens_per_s"):
                self._tb.add_scalar(f"train/{k}", m[k], step)
        if self._bar is not None:
            self._bar.update(1)
            if step % self.cfg.train.log_every == 0 or step == self.stop_step:
                self._bar.set_postfix(loss=f"{m['loss']:.4f}", lr=f"{m['lr']:.2e}", tok_s=f"{m['tokens_per_s']:.0f}")
        if step % self.cfg.train.log_every == 0:
            log.debug("step %d loss %.4f lr %.3e gnorm %.3f tok/s %.0f", step, m["loss"], m["lr"], m["grad_norm"],
                      m["tokens_per_s"])

    def progress(self):
        from tqdm.auto import tqdm

        self._bar = tqdm(total=self.stop_step, initial=self.step, unit="step", desc=f"train {self.run}",
                         disable=not (self.progress_enabled and self.dist.is_main), mininterval=1.0, dynamic_ncols=True)
        return self._bar

    def checkpoint_due(self, step: int) -> bool:
        every = self.cfg.train.ckpt_every
        return bool(every) and step % every == 0 and step < self.stop_step

    # ------------------------------------------------------------------------------ checkpoint
    def checkpoint(self, step: int, complete_extra: dict[str, Any] | None = None) -> PushResult | None:
        """Save, push, verify, roll the pointer, prune. All ranks return together or raise together."""
        rngs = dist.gather(ckstate.rng_state())
        result, err = None, None
        if self.dist.is_main:
            try:
                result = self._save_and_push(step, rngs)
            except (BatonError, OSError) as e:
                err = f"{type(e).__name__}: {e}"
        err = dist.broadcast(err)
        if err:
            raise StoreError(
                f"checkpoint at step {step} was not verified in {self.store.describe()} ({err}); the pointer "
                f"still names the previous verified checkpoint and the local copy is kept in {self.run_dir / 'ckpt'}"
            )
        self._last_ckpt_step = step
        return result

    def _save_and_push(self, step: int, rngs: list[dict[str, Any]]) -> PushResult:
        cursor = self.data.cursor(step * self.cfg.train.global_batch, step)
        state = {
            "step": step,
            "total_steps": self.total_steps,
            "cursor": cursor.to_dict(),
            "scheduler": {"kind": "warmup-plateau-linear", "step": step, "total_steps": self.total_steps,
                          "warmup_steps": self.cfg.optim.warmup_steps, "decay_start": self.cfg.optim.decay_start},
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "rng": {"world_size": self.world, "ranks": rngs},
            "stats": {"nonfinite_skips": self.stats.nonfinite_skips,
                      "consecutive_nonfinite": self.stats.consecutive_nonfinite, "last_loss": self.stats.last_loss},
            "config": self.cfg.to_dict(),
            "versions": versions(),
            "params": self.n_params,
        }
        folder = ckstate.save_checkpoint(self.run_dir / "ckpt" / f"step-{step}", self.model, self.optimizer, state,
                                         self.metrics_path)
        result = push_checkpoint(self.store, self.run, folder, step, cursor.to_dict(), self.cfg.store.verify,
                                 self.cfg.store.keep_last)
        row = {"step": step, "samples_consumed": cursor.samples_consumed, "verified": result.verified,
               "seconds": round(result.seconds, 3), "path": result.path}
        self.session_checkpoints.append(row)
        log.info("CKPT step %d samples=%d push+verify=%.1fs verified=%s", step, cursor.samples_consumed,
                 result.seconds, result.verified)
        return result

    # ------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        model = getattr(self.model, "module", self.model)
        model.eval()
        ids = self.data.val_window_ids()[self.dist.rank :: self.world]
        loss_sum, count = 0.0, 0
        mb = self.cfg.train.micro_batch
        for i in range(0, len(ids), mb):
            x, y = self.data.windows(ids[i : i + mb])
            x, y = x.to(self.device), y.to(self.device)
            with self.autocast():
                logits = model(input_ids=x).logits
            losses = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").mean(1)
            loss_sum += float(losses.double().sum())
            count += len(ids[i : i + mb])
        model.train()
        loss_sum = dist.total(loss_sum, self.device)
        count = int(dist.total(count, self.device))
        self.peak_eval = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else _rss_peak()
        if count == 0:
            return {}
        val_loss = loss_sum / count
        return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700)), "val_windows": count}

    # -------------------------------------------------------------------------------- finishing
    def finish(self) -> None:
        """At the horizon: final evaluation, export, push the export, and mark the run complete."""
        self.val = self.evaluate()
        log.info("validation: loss %.4f ppl %.2f over %d windows", self.val.get("val_loss", float("nan")),
                 self.val.get("val_ppl", float("nan")), self.val.get("val_windows", 0))
        err = None
        if self.dist.is_main:
            try:
                self._publish_final()
            except (BatonError, OSError) as e:
                err = f"{type(e).__name__}: {e}"
        err = dist.broadcast(err)
        if err:
            raise StoreError(f"the final model could not be published to {self.store.describe()}: {err}")

    def _publish_final(self) -> None:
        from .export import export_model

        pointer = read_pointer(self.store, self.run)
        if pointer is None or pointer["step"] != self.step:
            raise StoreError(f"expected the pointer at step {self.step} before publishing the final model")
        out = self.run_dir / "final"
        manifest = self.data.manifest["tokenizer"]
        export_model(self.model, Path(self.cfg.data.dir) / TOKENIZER_FILE, out, manifest["eos_token"],
                     meta={"run": self.run, "step": self.step, **(self.val or {}), "config": self.cfg.to_dict()})
        files, _ = push_folder(self.store, out, f"{self.run}/final", self.cfg.store.verify)
        done = make_pointer(self.run, pointer["step"], pointer["path"], pointer["files"], pointer["cursor"],
                            complete=True, extra={"final": {"path": "final", "files": files}, **(self.val or {})})
        write_pointer(self.store, self.run, done)
        log.info("run %s complete: final model verified at %s/final; pointer marks the run complete",
                 self.run, self.run)

    def summary(self, tokens_per_s: float) -> dict[str, Any]:
        gb = self.cfg.train.global_batch
        peak_train = int(dist.maximum(self.peak_train, self.device))
        peak_eval = int(dist.maximum(self.peak_eval, self.device))
        return {
            "run": self.run,
            "params": self.n_params,
            "steps_done": self.step,
            "total_steps": self.total_steps,
            "tokens_consumed": self.step * gb * self.cfg.data.seq_len,
            "samples_consumed": self.step * gb,
            "final_train_loss": self.stats.last_loss,
            "val_loss": (self.val or {}).get("val_loss"),
            "val_ppl": (self.val or {}).get("val_ppl"),
            "tokens_per_s": tokens_per_s,
            "peak_memory_bytes": max(peak_train, peak_eval),
            "peak_memory_train_bytes": peak_train,
            "peak_memory_eval_bytes": peak_eval,
            "nonfinite_skips": self.stats.nonfinite_skips,
            "checkpoints": self.session_checkpoints,
            "resumed_from_step": self.resumed_from,
            "stopped_by": signal.Signals(self._stop_signal).name if self._stop_signal else None,
            "world_size": self.world,
            "device": str(self.device),
            "store": self.store.describe(),
            "seconds": round(time.time() - self.t_start, 3),
            "config": self.cfg.to_dict(),
            "versions": versions(),
        }

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / "run_summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=1), encoding="utf-8")
            tmp.replace(self.run_dir / "run_summary.json")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        for s, h in getattr(self, "_old_handlers", {}).items():
            signal.signal(s, h)


def _pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={spec!r} but no CUDA GPU is visible (use train.device='cpu' or 'auto')")
    return torch.device(spec)


def _adamw(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    o = cfg.optim
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
        fused=True if device.type == "cuda" else None,
    )


def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))
