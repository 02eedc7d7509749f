"""Typed, nested, self-validating configuration: TOML in, dotted ``--set`` overrides, JSON out.

Each field carries its own rules: its type (a ``Literal`` names the choices), its help text and its bounds
(``opt``'s metadata). ``validate`` checks every field against them, then each section's cross-field rules
(``problems``), and raises once with every problem, so a user fixes a config in one pass instead of one error
per run. ``reference_table`` (``baton config --reference``, docs/configuration.md) is generated from the same
metadata.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import math
import operator
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import BatonError, ConfigError

if sys.version_info >= (3, 11):
    import tomllib  # novermin: imported only where the standard library has it
else:  # Python 3.10: the same parser, as the tomli package (a dependency there)
    import tomli as tomllib

# liger's fused head writes the logits' gradient in fp16 before the GradScaler's scale applies
# (baton.runtime.fused_ce): said by the config check when both are set, and by autotune when auto chose fp16.
FUSED_CE_FP16 = ("train.fused_ce='liger' does not run under precision fp16: its kernel makes the logits' gradient "
                 "in fp16 before the loss scale applies, and most of it rounds to zero (set train.fused_ce = "
                 "\"chunked\", \"auto\" or false, or train.precision = \"bf16\" on an Ampere or newer GPU)")
# The choices other modules name too (the others are written on their fields alone).
Attn = Literal["eager", "sdpa", "flash_attention_2"]
AttnSetting = Literal["auto", "eager", "sdpa", "flash_attention_2"]  # model.attn: auto is resolved on the device
Precision = Literal["fp32", "bf16", "fp16", "auto"]
Schedule = Literal["wsd", "cosine", "linear"]  # baton.model.schedule computes each
ATTN_IMPLS: tuple[Attn, ...] = typing.get_args(Attn)
SCHEDULES: tuple[str, ...] = typing.get_args(Schedule)
# train.slurm_signal: each is a stop signal of the session, passed on by the launcher and by torchrun.
WARNING_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
HUB_REPO = re.compile(r"[\w.-]+/[\w.-]+")  # owner/name, as the Hub spells repository ids
HUB_TOKENIZER = re.compile(r"hf://([\w.-]+/[\w.-]+)(?:@([^\s@]+))?")  # data.tokenizer naming a Hub repository
_BOUNDS = {"gt": (">", operator.gt), "ge": (">=", operator.ge), "lt": ("<", operator.lt), "le": ("<=", operator.le)}


def opt(default: Any, help: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
        le: float | None = None) -> Any:
    """A config field: its default, its help text (the reference's meaning) and the bounds ``validate`` checks."""
    given = {"gt": gt, "ge": ge, "lt": lt, "le": le}
    meta = {"help": help, "bounds": {k: v for k, v in given.items() if v is not None}}
    if isinstance(default, list):  # each config gets its own copy of a list default
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


class _Section:
    def problems(self, cfg: Config) -> list[str]:
        """The rules that tie this section's fields to each other or to other sections (bounds and choices are
        the fields' own, checked for every field alike)."""
        return []


@dataclass
class ModelConfig(_Section):
    """The Llama shape (transformers' ``LlamaForCausalLM``)."""

    n_layers: int = opt(4, "transformer blocks", gt=0)
    hidden: int = opt(128, "model width; must be divisible by n_heads", gt=0)
    n_heads: int = opt(4, "attention heads", gt=0)
    n_kv_heads: int = opt(2, "key/value heads (GQA); must divide n_heads", gt=0)
    ffn: int = opt(384, "SwiGLU inner width", gt=0)
    vocab_size: int = opt(4096, "embedding rows; must be >= the tokenizer's vocabulary", gt=0)
    tie_embeddings: bool = opt(True, "share the input embedding with the output head")
    rope_theta: float = opt(10000.0, "RoPE base", gt=0)
    max_seq_len: int = opt(2048, "position limit; must be >= data.seq_len", gt=0)
    attn: AttnSetting = opt("auto", "attention implementation: eager, sdpa, flash_attention_2, or auto (sdpa on "
                                    "CPU and on Ampere or newer GPUs; on older GPUs the faster of eager and sdpa, "
                                    "measured at the session's shape when it starts)")
    grad_ckpt: bool = opt(False, "activation (gradient) checkpointing")
    init_std: float = opt(0.02, "weight init standard deviation", gt=0)
    norm_eps: float = opt(1e-5, "RMSNorm epsilon", gt=0)

    def problems(self, cfg: Config) -> list[str]:
        if min(self.hidden, self.n_heads, self.n_kv_heads) <= 0:
            return []  # said by the bounds, and the divisions below need them
        out = []
        if self.hidden % self.n_heads:
            # Suggestions that pass the other rules too: an even head dim (RoPE) and a multiple of n_kv_heads (GQA).
            fits = _divisors_near(self.hidden, self.n_heads, lambda x: (self.hidden // x) % 2 == 0
                                  and x % self.n_kv_heads == 0)
            step = 2 * self.n_kv_heads * self.n_heads  # a hidden this divides keeps n_heads and both rules
            near = f"pick n_heads among the divisors of hidden, e.g. {fits}" if fits else (
                f"no n_heads near it divides hidden into even head dims in groups of n_kv_heads={self.n_kv_heads}: "
                f"change hidden, e.g. to {max(step, self.hidden // step * step)}")
            out.append(f"model.hidden={self.hidden} is not divisible by model.n_heads={self.n_heads} ({near})")
        elif (self.hidden // self.n_heads) % 2:
            out.append(f"head dim hidden/n_heads = {self.hidden // self.n_heads} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            out.append(f"model.n_heads={self.n_heads} is not divisible by model.n_kv_heads={self.n_kv_heads} (GQA "
                       f"needs n_kv_heads to divide n_heads, e.g. {_divisors_near(self.n_heads, self.n_kv_heads)})")
        return out


@dataclass
class SourceConfig:
    """One input of the data mix."""

    kind: Literal["stdlib", "text", "jsonl", "parquet", "hf_dataset", "hub"] = opt(
        "text", "what the path holds (stdlib: Python's own library sources, a built-in corpus; hub: a Hub dataset "
                "repository, read by repo and files)")
    path: str = opt("", "file, folder or glob (unused for stdlib and hub)")
    field: str = opt("text", "JSONL field / Parquet column / dataset column holding the text")
    max_bytes: int = opt(0, "cap on bytes of text read from this source (0 = no cap)", ge=0)
    max_tokens: int = opt(0, "cap on tokens taken from this source (0 = no cap)", ge=0)
    weight: float = opt(1.0, "repeat factor in the mix (fractional part: a seeded share of documents)", gt=0)
    repo: str = opt("", "kind hub: the dataset repository, owner/name (HF_TOKEN for a private or gated one)")
    revision: str = opt("main", "kind hub: branch, tag or commit; prepare pins the commit it resolves to")
    files: str = opt("", "kind hub: which files of the repository, a glob (e.g. sample/10BT/*.parquet); Parquet or "
                         "JSONL(.gz); or config")
    config: str = opt("", "kind hub: a config the repository's README.md declares (e.g. sample-10BT): its "
                          "data_files at the pinned commit; instead of files")
    split: str = opt("train", "kind hub: the split of config to read")
    stream: bool = opt(False, "kind hub: delete each file once tokenized (disk: the shards plus a few source files)")
    prefetch: int = opt(2, "kind hub: files downloaded ahead of the one being read (0 = one at a time)", ge=0)

    def problems(self, where: str) -> list[str]:
        """A hub source names its repository and files; a local one names a path."""
        if self.kind != "hub":
            needs_path = self.kind != "stdlib" and not self.path
            return ([f"{where} ({self.kind}) needs a path"] if needs_path else []) + (
                [f"{where} ({self.kind}) reads local files: repo, files, config and split are for kind = \"hub\""]
                if self.repo or self.files or self.config or self.split != "train" else [])
        out = []
        if not HUB_REPO.fullmatch(self.repo):
            out.append(f"{where} (hub) needs repo = \"owner/name\" (a Hub dataset repository), got {self.repo!r}")
        if not self.revision.strip():
            out.append(f"{where}.revision must name a branch, tag or commit (default main)")
        if self.files.strip() and self.config.strip():
            out.append(f"{where} (hub) takes files or config, not both (files: a glob of the repository's files; "
                       "config: one its README.md declares)")
        elif not self.files.strip() and not self.config.strip():
            out.append(f"{where} (hub) needs files = \"...\", a glob of the repository's files (e.g. "
                       "\"data/*.parquet\"), or config = \"...\", a config its README.md declares")
        if not self.split.strip():
            out.append(f"{where}.split must name a split of the config (default train)")
        elif self.split != "train" and not self.config.strip():
            out.append(f"{where}.split = {self.split!r} selects a split of a config: set config too (with files, "
                       "the glob alone selects)")
        if self.path:
            out.append(f"{where} (hub) takes repo and files, not path (path names local files)")
        return out


@dataclass
class DataConfig(_Section):
    """Prepared token shards and how the reader cuts and orders them."""

    dir: str = opt("data/tiny", "where `baton prepare` writes shards and `baton train` reads them")
    sources: list[SourceConfig] = opt([SourceConfig(kind="stdlib")],
                                      "[[data.sources]] tables (fields: data.sources[].*)")
    tokenizer: str = opt("", "tokenizer.json, a local HF tokenizer folder or hf://owner/name[@revision] (its "
                             "tokenizer.json, pinned by sha256); \"\" trains a byte-level BPE")
    tokenizer_vocab: int = opt(4096, "vocabulary size when baton trains the tokenizer", gt=0)
    # prepare fills one shard in memory: 2^30 tokens is 2-4 GiB, and larger shards gain nothing (they are mapped)
    shard_tokens: int = opt(16_777_216, "tokens per shard file", gt=0, le=1 << 30)
    seq_len: int = opt(128, "tokens per training window", gt=0)
    shuffle_seed: int = opt(1234, "seed of the global window permutation")
    val_windows: int = opt(32, "held-out windows for validation (taken from the end of the stream)", ge=0)
    prepare_workers: int = opt(0, "encoding processes for prepare (0 = one per core on large corpora, 1 = "
                                  "in-process)", ge=0)
    decontaminate: list[str] = opt([], "evaluation text files/globs: drop training documents sharing an n-gram "
                                       "with them")
    decontam_ngram: int = opt(13, "n-gram length in tokens for decontaminate", gt=0, le=1024)
    url: str = opt("", "where the prepared dataset is published: path, file://, s3:// or hf://datasets/owner/name "
                       "(\"\" = data.dir only); train pulls it into data.dir")
    transfer_workers: int = opt(4, "files uploaded or downloaded at once by publish-data and the pull before "
                                   "training", ge=1, le=64)

    def problems(self, cfg: Config) -> list[str]:
        out = []
        if self.seq_len > cfg.model.max_seq_len:
            out.append(f"data.seq_len={self.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len} (raise "
                       "max_seq_len)")
        kinds = _choices(_hints(SourceConfig)["kind"])
        for i, src in enumerate(self.sources):
            out += src.problems(f"data.sources[{i}]") if src.kind in kinds else []
        if self.tokenizer.startswith("hf://") and not HUB_TOKENIZER.fullmatch(self.tokenizer):
            out.append(f"data.tokenizer={self.tokenizer!r} must name a Hub repository as hf://owner/name or "
                       "hf://owner/name@revision")
        if not self.sources and not self.tokenizer:
            out.append("data.sources is empty (add at least one [[data.sources]] table)")
        if not self.tokenizer and self.tokenizer_vocab > cfg.model.vocab_size:
            # Found now, not by train after a prepare of hours (or by the tokenizer trainer running out of memory).
            out.append(f"data.tokenizer_vocab={self.tokenizer_vocab} exceeds model.vocab_size={cfg.model.vocab_size}: "
                       "the trained tokenizer's ids would not fit the embedding (lower data.tokenizer_vocab or raise "
                       "model.vocab_size)")
        out += _url_problems("data.url", self.url, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (S3) or HF_TOKEN (Hub)")
        if self.url and self.url.rstrip("/") == cfg.store.url.rstrip("/"):
            # The dataset sits at the root of data.url; the checkpoint store's root holds runs.
            out.append(f"data.url is the same location as store.url ({self.url!r}); give the dataset its own folder "
                       "or prefix, e.g. s3://bucket/datasets/NAME")
        return out


@dataclass
class OptimConfig(_Section):
    """The optimizer (AdamW, or Muon for the blocks' matrices) and the learning-rate schedule (baton.model.schedule)."""

    name: Literal["adamw", "muon"] = opt("adamw", "adamw, or muon (Muon for the 2-D matrices inside the blocks, "
                                                  "AdamW for the rest); fixed for a run")
    lr: float = opt(3e-4, "peak learning rate", gt=0)
    beta1: float = opt(0.9, "AdamW first-moment decay", ge=0, lt=1)
    beta2: float = opt(0.95, "AdamW second-moment decay", ge=0, lt=1)
    eps: float = opt(1e-8, "AdamW denominator epsilon", gt=0)
    weight_decay: float = opt(0.1, "applied to matrices only, not to norms", ge=0)
    grad_clip: float = opt(1.0, "max global gradient norm (0 = off)", ge=0)
    warmup_steps: int = opt(100, "linear warmup length in optimizer steps", ge=0)
    decay_start: float = opt(0.8, "fraction of the horizon where the wsd cooldown begins", gt=0, le=1)
    decay_step: int = opt(0, "the step where the wsd cooldown begins, instead of decay_start (0 = decay_start of "
                             "the horizon); a cooldown branch (`baton anneal`) sets its branch point", ge=0)
    schedule: Schedule = opt("wsd", "wsd (warmup, plateau, cooldown), or cosine or linear (both decay from the "
                                       "warmup's end)")
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = opt("linear", "the wsd cooldown's shape")
    min_lr_ratio: float = opt(0.0, "the floor the decay falls towards, as a fraction of optim.lr", ge=0, lt=1)
    muon_lr: float = opt(0.02, "Muon's peak learning rate; the schedule scales it by the same factor as optim.lr",
                         gt=0)
    muon_momentum: float = opt(0.95, "Muon's momentum", ge=0, lt=1)
    muon_nesterov: bool = opt(True, "Nesterov momentum for Muon")
    # torch refuses 100 Newton-Schulz steps and more
    muon_ns_steps: int = opt(5, "Newton-Schulz iterations per Muon step", ge=1, le=99)
    muon_adjust_lr: Literal["original", "match_rms_adamw", "spectral_unclamped"] = opt(
        "original", "Muon's per-matrix lr scaling (torch.optim.Muon's adjust_lr_fn)")
    muon_weight_decay: float = opt(0.0, "Muon's decoupled weight decay (param *= 1 - lr x decay each step)", ge=0)

    def problems(self, cfg: Config) -> list[str]:
        out = []
        if self.name == "muon" and cfg.train.parallel == "fsdp":
            # FSDP shards each matrix over the ranks; Newton-Schulz on a shard orthogonalises another matrix.
            out.append("optim.name='muon' does not work with train.parallel='fsdp' (each rank would orthogonalise a "
                       "shard of every matrix, not the matrix); use train.parallel='ddp' with muon, or "
                       "optim.name='adamw'")
        if self.decay_step and self.schedule != "wsd":
            out.append(f"optim.decay_step={self.decay_step} places the wsd cooldown, but optim.schedule is "
                       f"{self.schedule!r}, which decays from the warmup's end (set optim.decay_step = 0, or "
                       "optim.schedule = \"wsd\")")
        elif self.decay_step and cfg.tokens_per_step > 0 and self.decay_step >= cfg.total_steps > 0:
            out.append(f"optim.decay_step={self.decay_step} is not before the horizon ({cfg.total_steps} steps): the "
                       "cooldown would never begin (lower it, or set 0 for decay_start of the horizon)")
        return out


@dataclass
class TrainConfig(_Section):
    """The horizon, batch geometry, precision and cadence."""

    steps: int = opt(1000, "horizon in optimizer steps (set 0 to use target_tokens)", ge=0)
    target_tokens: int = opt(0, "horizon in tokens; steps = target_tokens // tokens_per_step", ge=0)
    micro_batch: int | Literal["auto"] = opt(4, "samples per rank per forward/backward, or \"auto\" (largest that "
                                                "fits the GPU)", gt=0)
    global_batch: int = opt(16, "samples per optimizer step over all ranks (accumulation is derived)", gt=0)
    precision: Precision = opt("fp32", "fp16 runs with a GradScaler; auto: bf16 on Ampere+, fp16 on older GPUs, "
                                       "fp32 on CPU")
    compile: Literal["auto"] | bool = opt("auto", "torch.compile model + loss (auto: on for CUDA, off on CPU)")
    compile_scope: Literal["blocks", "model"] = opt(
        "blocks", "what train.compile compiles: blocks (the decoder block once, shared by every layer, and the loss: "
                  "a fraction of the cold compile) or model (the model and the loss as one graph)")
    compile_cache: bool = opt(True, "carry torch.compile's artifacts with the run: pushed to the store after a "
                                    "session's first compiled step, loaded by the next session before it compiles "
                                    "(code the sessions run: trust the store as you trust the code)")
    fused_ce: Literal["auto", "chunked", "liger"] | bool = opt(
        "auto", "output head + cross-entropy a chunk of rows at a time, no full logits: chunked (torch, compiled "
                "with the model; = true) or liger (liger-kernel, CUDA, not fp16); auto: chunked on CUDA, off on CPU")
    deterministic: bool = opt(False, "deterministic kernels + fixed cuBLAS workspace: bit-identical resume on CUDA, "
                                     "costs speed")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N (that GPU, in a single process)")
    seed: int = opt(0, "model init and dropout-free RNG seed")
    threads: int = opt(0, "torch CPU threads (0 = torch's default)", ge=0, le=4096)
    ckpt_every: int = opt(0, "also checkpoint every N steps (0 = only at the end of the session)", ge=0)
    log_every: int = opt(10, "progress/metrics cadence in steps (metrics.jsonl gets every step)", gt=0)
    max_nonfinite: int = opt(5, "consecutive skipped (non-finite) steps before the run stops", gt=0)
    parallel: Literal["ddp", "fsdp"] = opt("ddp", "ddp (a replica per rank) or fsdp (fully_shard: weights, grads, "
                                                  "moments sharded)")
    dist_timeout: int = opt(600, "seconds a rank waits in a collective before failing (bounds a hang)", gt=0)
    spike_policy: Literal["log", "rollback", "stop"] = opt(
        "log", "on a loss spike: log, rollback (to the checkpoint before it, skipping its data) or stop")
    spike_threshold: float = opt(6.0, "a spike: loss above the window's median by this many robust sigmas "
                                      "(1.4826 x MAD)", gt=0)
    # a median and its spread need a few losses
    spike_window: int = opt(50, "recent losses the spike threshold is measured on (no verdict before it is full)",
                            ge=3)
    spike_skip_windows: int = opt(0, "windows skipped on a rollback, ending with the spiking batch (0 = its global "
                                     "batch)", ge=0)
    max_rollbacks: int = opt(3, "rollbacks a run may make; one more spike ends the run", ge=0)
    eval_every: int = opt(0, "also evaluate the held-out windows every N steps (0 = only at the end of the run)",
                          ge=0)
    requeue: Literal["auto", "off"] = opt("auto", "in a SLURM batch job: auto (a session stopped by time or a signal, "
                                                  "the run not complete, requeues its job after the verified push) "
                                                  "or off")
    max_requeues: int = opt(20, "auto requeue stops once the job was requeued this many times "
                                "(SLURM_RESTART_COUNT; 0 = never requeue)", ge=0)
    slurm_signal: str = opt("USR1", "SLURM's warning signal (sbatch --signal=B:USR1@600): checkpoint and stop, as "
                                    "on SIGTERM; " + " | ".join(WARNING_SIGNALS))

    def problems(self, cfg: Config) -> list[str]:
        out = []
        mb, gb = self.micro_batch, self.global_batch
        if isinstance(mb, int) and mb > 0 and gb % mb:
            out.append(f"train.global_batch={gb} is not a multiple of train.micro_batch={mb}")
        if min(self.steps, self.target_tokens) >= 0:  # a negative one is said by the bounds
            if self.steps > 0 and self.target_tokens > 0:
                out.append("set exactly one of train.steps and train.target_tokens (set train.steps = 0 to use "
                           "target_tokens)")
            elif self.steps == 0 and self.target_tokens == 0:
                out.append("the run has no horizon: train.steps and train.target_tokens are both 0 (set train.steps "
                           "to the optimizer steps to train, or train.target_tokens to the tokens)")
            elif self.target_tokens and cfg.tokens_per_step > 0 and cfg.total_steps == 0:
                out.append(f"train.target_tokens={self.target_tokens} is less than one step of "
                           f"{cfg.tokens_per_step} tokens")
        if self.fused_ce == "liger" and self.precision == "fp16":
            out.append(FUSED_CE_FP16)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            out.append(f"train.device={self.device!r} is not auto, cpu or cuda")
        if self.eval_every > 0 and cfg.data.val_windows == 0:  # else it would validate nothing, silently
            out.append(f"train.eval_every={self.eval_every} needs held-out windows: set data.val_windows > 0, or "
                       "train.eval_every = 0")
        if self.slurm_signal.upper().removeprefix("SIG") not in WARNING_SIGNALS:  # USR1, SIGUSR1 and usr1 alike
            out.append(f"train.slurm_signal={self.slurm_signal!r} is not one of {', '.join(WARNING_SIGNALS)} (the "
                       "signal named in sbatch --signal=B:USR1@600)")
        return out


@dataclass
class StoreConfig(_Section):
    """Where verified checkpoints live: a local folder, s3://bucket/prefix or hf://owner/repo."""

    url: str = opt("store", "local path, file://, s3:// or hf://")
    keep_last: int = opt(2, "verified checkpoints kept in the store", gt=0)
    verify: Literal["sample", "full"] = opt("sample", "sample (listing + ranged windows) or full (reread every byte)")
    async_push: bool = opt(True, "upload + verify in the background while training goes on (one at a time)")
    # Past these bounds a value is a slip (an hour typed as milliseconds), not a policy, and the sockets' own
    # limits would refuse it mid-run; how long retrying lasts is store.retry_seconds' to bound.
    retries: int = opt(6, "attempts per store call on transient errors (timeouts, resets, 429, 5xx)", ge=1, le=100)
    retry_seconds: float = opt(300.0, "no retry starts after this long (up to a day); then the push fails", gt=0,
                               le=86400)
    request_timeout: float = opt(120.0, "seconds an S3/Hub request may wait on a silent server, then retried (up "
                                        "to an hour)", gt=0, le=3600)
    lease_seconds: float = opt(60.0, "the run's lease lives this long without a renewal (renewed every third of it); "
                                     "a killed session's run is free again after it", ge=2, le=3600)

    def problems(self, cfg: Config) -> list[str]:
        if not self.url:
            return ["store.url is empty (a local folder, s3://bucket/prefix or hf://owner/repo)"]
        return _url_problems("store.url", self.url, "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (S3) or HF_TOKEN "
                                                    "(Hub)")


@dataclass
class BudgetConfig(_Section):
    """Time and quota: when a session must stop, how hours are billed, what the quota allows."""

    session_hours: float = opt(0.0, "stop in time to checkpoint within H hours of `baton train` starting (0 = no "
                                    "limit)", ge=0)
    margin_minutes: float = opt(5.0, "kept free before the deadline, on top of the measured step and checkpoint "
                                     "times", ge=0)
    ckpt_minutes: float | Literal["auto"] = opt(0.0, "also checkpoint when M minutes passed since the last one "
                                                     "began (0 = step cadence only; \"auto\" = chosen from the "
                                                     "ledger's interruptions and checkpoint times)", ge=0)
    ckpt_seconds: float = opt(0.0, "expected checkpoint cycle before one is measured (0 = a slow guess from the "
                                   "model size)", ge=0)
    startup_minutes: float = opt(0.0, "plan: time per session before the first step (install, pull, build)", ge=0)
    heartbeat_minutes: float = opt(10.0, "ledger heartbeat between checkpoints (0 = at checkpoints only)", ge=0)
    bill_factor: float = opt(0.0, "billed hours per wall-clock hour (0 = one per rank; 1 for a platform that bills "
                                  "the machine)", ge=0)
    quota_hours: float = opt(0.0, "billed hours allowed per quota period (0 = no quota)", ge=0)
    # A minute to a century: shorter or longer periods are typos, and the calendar's dates would overflow.
    quota_period_days: float = opt(7.0, "length of a quota period", ge=1 / 1440, le=36500)
    quota_reset: str = opt("", "an instant at which the quota resets, recurring every period (e.g. "
                               "2026-09-26T00:00Z)")
    cap_hours: float = opt(0.0, "cap on the billed hours of this run, e.g. a budget for tests (0 = none)", ge=0)
    tripwires: list[str] = opt([], "'RATE: target=0.9B' or 'RATE: micro=8, accum=16'")
    finish_by: str = opt("", "an instant the run must be complete by (ISO 8601, e.g. 2026-10-01T00:00Z); anytime "
                             "mode forecasts against it")
    anytime: bool = opt(False, "at every session start and checkpoint, forecast whether the horizon and its wsd "
                               "cooldown still fit budget.cap_hours / budget.finish_by; when not, shorten the horizon "
                               "so the cooldown starts now (docs/anytime-mode.md)")
    anytime_confidence: float = opt(0.9, "anytime mode: the forecast must fit with this probability (0.9: its P90)",
                                    gt=0, lt=1)

    def problems(self, cfg: Config) -> list[str]:
        from .planning.plan import parse_instant
        from .planning.tripwires import parse_tripwire

        out = []
        if self.quota_hours and not self.quota_reset:
            out.append("budget.quota_hours is set but budget.quota_reset is not (e.g. quota_reset = "
                       "\"2026-09-26T00:00Z\")")
        try:
            if self.quota_reset:
                parse_instant(self.quota_reset, "budget.quota_reset")
            if self.finish_by:
                parse_instant(self.finish_by, "budget.finish_by")
            for w in self.tripwires:
                parse_tripwire(w)
        except BatonError as e:
            out.append(str(e))
        return out + (self.anytime_problems(cfg) if self.anytime else [])

    def anytime_problems(self, cfg: Config) -> list[str]:
        """What anytime mode needs: an end to forecast against, sessions to plan, and a wsd cooldown to move."""
        out = []
        if not self.cap_hours and not self.finish_by:
            out.append("budget.anytime needs an end to forecast against: set budget.cap_hours (the billed hours the "
                       "run may use) or budget.finish_by (when it must be complete), or budget.anytime = false")
        if not self.session_hours:
            out.append("budget.anytime forecasts the relay's sessions: set budget.session_hours (the platform's "
                       "session limit), or budget.anytime = false")
        if cfg.optim.schedule != "wsd":
            out.append(f"budget.anytime moves the start of a wsd cooldown, but optim.schedule is "
                       f"{cfg.optim.schedule!r} (it decays from the warmup's end, so a shorter horizon would change "
                       "updates already made): set optim.schedule = \"wsd\", or budget.anytime = false")
        elif cfg.optim.decay_step:
            # The cooldown's start is fixed at a step: anytime mode moves decay_start of the horizon, which would
            # then end a shortened run at the peak learning rate, or cut a cooldown under way.
            out.append(f"budget.anytime moves the cooldown's start with the horizon, but optim.decay_step="
                       f"{cfg.optim.decay_step} fixes it: set optim.decay_step = 0 (decay_start of the horizon), or "
                       "budget.anytime = false")
        elif cfg.optim.decay_start >= 1:
            out.append("budget.anytime needs a cooldown to start: optim.decay_start = 1 leaves none (set it below 1, "
                       "e.g. 0.8), or budget.anytime = false")
        return out


@dataclass
class LogConfig(_Section):
    """Where the metrics go besides metrics.jsonl (always written: it travels in every checkpoint)."""

    # The names are the tracking package's (baton.tracking.names.BACKENDS, a layer below this one).
    backends: list[str] = opt(["jsonl"], "any of jsonl, tensorboard, wandb, mlflow (rank 0 logs)")
    project: str = opt("baton", "W&B project; also the MLflow experiment unless log.experiment is set")
    entity: str = opt("", "W&B entity (team or user; \"\" = the account's default)")
    experiment: str = opt("", "MLflow experiment name (\"\" = log.project)")
    run_name: str = opt("", "the tracker run's display name (\"\" = run.name)")
    mlflow_uri: str = opt("", "MLflow tracking URI (\"\" = MLFLOW_TRACKING_URI, else MLflow's default); no "
                              "credentials")

    def problems(self, cfg: Config) -> list[str]:
        from .tracking.names import BACKENDS

        out = [f"log.backends: {b!r} is not one of {', '.join(BACKENDS)}" for b in self.backends if b not in BACKENDS]
        if len(set(self.backends)) != len(self.backends):
            out.append(f"log.backends lists a backend twice: {self.backends}")
        return out + _url_problems("log.mlflow_uri", self.mlflow_uri, "MLFLOW_TRACKING_USERNAME / "
                                   "MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN")


@dataclass
class RunConfig(_Section):
    """Names the run; the store prefix and local run directory derive from it."""

    name: str = opt("tiny", "run name: store prefix <name>/ and local folder <local_dir>/<name>")
    local_dir: str = opt("runs", "root of local run directories")

    def problems(self, cfg: Config) -> list[str]:
        return run_name_problems(self.name, "run.name") or branch_problems(cfg)


@dataclass
class PublishConfig(_Section):
    """Where the finished model goes as a Hugging Face model repository (`baton publish`)."""

    url: str = opt("", "hf://owner/model-repo, s3://, file:// or a path: the model at its root (empty = no "
                       "publishing)")
    every: int = opt(0, "also publish each verified checkpoint at a multiple of N steps as revision step-N (0 = off)",
                     ge=0)
    license: str = opt("apache-2.0", "license named in the model card's metadata")
    tags: list[str] = opt([], "extra Hub tags for the model card")

    def problems(self, cfg: Config) -> list[str]:
        scheme = self.url.split("://", 1)[0] if "://" in self.url else None
        if scheme not in (None, "file", "s3", "hf"):
            return [f"publish.url {scheme}:// is not supported (use hf://owner/repo, s3://, file:// or a path)"]
        return _url_problems("publish.url", self.url, "HF_TOKEN (Hub) or AWS_ACCESS_KEY_ID / "
                                                      "AWS_SECRET_ACCESS_KEY (S3)")


@dataclass
class EvalConfig(_Section):
    """`baton eval` beyond the held-out windows: extra files and lm-evaluation-harness tasks."""

    files: list[str] = opt([], "text or JSONL files scored for loss and bits per byte")
    tasks: list[str] = opt([], "lm-evaluation-harness task names (needs the eval extra)")
    task_dir: str = opt("", "folder of local task YAML files for lm-eval (offline use)")
    limit: int = opt(0, "documents per lm-eval task (0 = all)", ge=0)
    field: str = opt("text", "JSONL field holding the text of eval.files")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    # ---- derived quantities (never stored, always recomputed) ----
    @property
    def tokens_per_step(self) -> int:
        return self.train.global_batch * self.data.seq_len

    @property
    def total_steps(self) -> int:
        if self.train.steps > 0:
            return self.train.steps
        return self.train.target_tokens // self.tokens_per_step

    @property
    def run_dir(self) -> Path:
        return Path(self.run.local_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        # A NaN or infinity makes the range checks meaningless (NaN fails none of them): named alone.
        # A path or URL no file system or urllib takes is named alone too: later checks would trip on it.
        from .guard import config_problems

        problems = _type_problems(self) or _nonfinite_problems(self) or config_problems(self) or [
            *_field_problems(self), *(
            p for f in dataclasses.fields(self) for p in getattr(self, f.name).problems(self))]
        if problems:
            raise ConfigError(_format(problems))


# --------------------------------------------------------------------------------------------------
# loading


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read TOML (or start from defaults when ``path`` is None), apply ``a.b=c`` overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        from .guard import input_path
        from .reads import reading

        p = input_path(path, "config file", "pass --config with an existing TOML file")
        try:
            with reading(p, "config file", "save it as UTF-8 TOML text, or pass --config with a TOML file"):
                text = p.read_text(encoding="utf-8")
            # JSON: the resolved config as a checkpoint or a launcher saved it (`baton config` prints it too).
            raw = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"config file {p} is not valid {p.suffix == '.json' and 'JSON' or 'TOML'}: {e}") from None
    problems: list[str] = []
    for item in overrides:
        _apply_override(raw, item, problems)
    cfg = _build(Config, raw, "", problems) if not problems else None
    if problems:
        raise ConfigError(_format(problems))
    assert cfg is not None
    cfg.validate()
    return cfg


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Rebuild a config saved in a checkpoint or summary (same validation as a file)."""
    problems: list[str] = []
    cfg = _build(Config, raw, "", problems)
    if problems:
        raise ConfigError(_format(problems))
    cfg.validate()
    return cfg


def config_json(cfg: Config) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)


def _apply_override(raw: dict[str, Any], item: str, problems: list[str]) -> None:
    if "=" not in item:
        problems.append(f"--set {item!r} is not KEY=VALUE (example: --set optim.lr=3e-4)")
        return
    key, text = item.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    # Resolve the key against the schema first so a typo is named, not silently added.
    cls: Any = Config
    for i, part in enumerate(parts):
        # Schema hints are classes, never dataclass instances: the isinstance only narrows the type
        hints = _hints(cls) if isinstance(cls, type) and dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            where = ".".join(parts[:i]) or "the top level"
            problems.append(
                f"--set {key}: no such key {part!r} in {where} (valid: {', '.join(sorted(hints)) or 'none'})"
            )
            return
        cls = hints[part]
    value = _parse_value(text)
    node = raw
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            problems.append(f"--set {key}: {part!r} is not a table in the config file")
            return
        node = nxt
    node[parts[-1]] = value


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # bare words are strings: --set store.url=s3://b/p


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        problems.append(f"{where or 'config'} must be a table, got {type(raw).__name__}")
        return cls()
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{where}.{key}" if where else key
        if key not in hints:
            problems.append(
                f"unknown key {name!r} (valid keys{' in [' + where + ']' if where else ''}: "
                f"{', '.join(sorted(hints))})"
            )
            continue
        kwargs[key] = _coerce(hints[key], value, name, problems)
    return cls(**kwargs)


INT64 = (-(1 << 63), (1 << 63) - 1)


def _coerce(tp: Any, value: Any, name: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, name, problems)
    if len(_members(tp)) > 1:
        # A number or a keyword (micro_batch = 4 | "auto"): the first member type that accepts it wins.
        for member in _members(tp):
            trial: list[str] = []
            coerced = _coerce(member, value, name, trial)
            if not trial:
                return coerced
        names = " or ".join(_type_name(m) for m in _members(tp))
        problems.append(f"{name} must be {names}, got {type(value).__name__} {value!r}")
        return None
    if origin is Literal:  # a value of the choices' type; which of them it must be, validate says with the rest
        return _coerce(type(typing.get_args(tp)[0]), value, name, problems)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.append(f"{name} must be a list, got {type(value).__name__} {value!r}")
            return []
        return [_coerce(item_tp, v, f"{name}[{i}]", problems) for i, v in enumerate(value)]
    if tp is str and isinstance(value, (datetime.date, datetime.time)):
        # An unquoted TOML date or time (quota_reset = 2026-09-26T00:00:00Z) arrives parsed: the text it was is
        # what the field holds.
        return value.isoformat()
    if tp is int and isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        # Every whole number here ends up in a 64-bit one (torch's seeds, numpy's arrays, file offsets).
        problems.append(f"{name} = {value} does not fit a 64-bit integer ({INT64[0]} to {INT64[1]})")
        return None
    ok = {
        bool: isinstance(value, bool),
        # bool is an int subclass in Python; `steps = true` is a mistake, not 1.
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(tp)
    if ok is None:  # pragma: no cover - a schema bug, not user input
        raise TypeError(f"unsupported config type {tp} for {name}")
    if not ok:
        problems.append(f"{name} must be {tp.__name__}, got {type(value).__name__} {value!r}")
        return None
    return float(value) if tp is float else value


def _format(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid config: {problems[0]}"
    return f"invalid config ({len(problems)} problems):\n  - " + "\n  - ".join(problems)


# --------------------------------------------------------------------------------------------------
# the rules every field declares: its choices (a Literal type) and its bounds (opt's metadata)


def _leaves(obj: Any, where: str = "") -> Iterator[tuple[str, Any, Any, dataclasses.Field[Any]]]:
    """(dotted key, type, value, field) for every value field, in field order, through data.sources[i]."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, key)
        elif isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
            for i, item in enumerate(value):
                yield from _leaves(item, f"{key}[{i}]")
        else:
            yield key, hints[f.name], value, f


def _type_problems(cfg: Config) -> list[str]:
    """Every value has its field's type, by the loader's own rule: a config built in code or changed in place
    (``cfg.model.hidden = "x"``) is held to what a file is. Said alone: the other rules compare and divide."""
    problems: list[str] = []
    for key, tp, value, _ in _leaves(cfg):
        (item,) = typing.get_args(tp) if typing.get_origin(tp) is list else (tp,)
        if not (isinstance(item, type) and dataclasses.is_dataclass(item)):
            _coerce(tp, value, key, problems)
        elif tp is item or not isinstance(value, list):  # a section, or the list of them, is not a table here
            problems.append(f"{key} must be {'a list of ' if tp is not item else 'a '}{item.__name__}, got "
                            f"{type(value).__name__}")
        else:
            problems += [f"{key}[{i}] must be a {item.__name__}, got {type(v).__name__}"
                         for i, v in enumerate(value) if not isinstance(v, item)]
    return problems


def _nonfinite_problems(cfg: Config) -> list[str]:
    """Every float key must be a finite number: NaN passes every range check (all comparisons are false)."""
    return [f"{key} must be a finite number, got {value}" for key, _, value, _ in _leaves(cfg)
            if isinstance(value, float) and not math.isfinite(value)]


def _field_problems(cfg: Config) -> list[str]:
    out = []
    for key, tp, value, f in _leaves(cfg):
        allowed, bounds = _choices(tp), f.metadata.get("bounds", {})
        if isinstance(value, str) and allowed and value not in allowed:
            out.append(_choice_problem(key, tp, value))
        elif bounds and not isinstance(value, str) and not all(_BOUNDS[k][1](value, b) for k, b in bounds.items()):
            out.append(f"{key} must be {_bounds_text(bounds)}, got {value}")
    return out


def _members(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _choices(tp: Any) -> list[str]:
    return [c for m in _members(tp) if typing.get_origin(m) is Literal for c in typing.get_args(m)]


def _choice_problem(key: str, tp: Any, value: str) -> str:
    if typing.get_origin(tp) is Literal:
        return f"{key}={value!r} is not one of {', '.join(_choices(tp))}"
    words = {bool: ["true", "false"], int: ["a number"], float: ["a number"]}
    alts = [w for m in _members(tp) for w in (typing.get_args(m) if typing.get_origin(m) is Literal else words[m])]
    if len(alts) == 2:
        return f"{key}={value!r} is neither {alts[0]} nor {alts[1]}"
    return f"{key}={value!r} is not {', '.join(alts[:-1])} or {alts[-1]}"


def _bounds_text(bounds: dict[str, float]) -> str:
    """``> 0``, ``>= 3``, or a range ``in [0, 1)`` with the brackets of its bounds' kinds."""
    if len(bounds) == 1:
        ((kind, b),) = bounds.items()
        return f"{_BOUNDS[kind][0]} {b:g}"
    lo, hi = sorted(bounds, key=lambda k: k[0] == "l")  # gt|ge, then lt|le
    return f"in {'(' if lo == 'gt' else '['}{bounds[lo]:g}, {bounds[hi]:g}{')' if hi == 'lt' else ']'}"


def _type_name(tp: Any) -> str:
    """int, list[str], ``eager | sdpa | flash_attention_2``, ``int | auto``: as the reference shows it."""
    if typing.get_origin(tp) is Literal:
        return " | ".join(typing.get_args(tp))
    if len(_members(tp)) > 1:
        return " | ".join(_type_name(m) for m in _members(tp))
    if typing.get_origin(tp) is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    return str(tp.__name__)


# --------------------------------------------------------------------------------------------------
# cross-field helpers


def run_name_problems(name: Any, what: str) -> list[str]:
    """A run name is a portable file name: it names a local folder and a store prefix. A cooldown branch's is
    its main run's name, ``/branches/`` and the branch's name (``baton.runs``)."""
    from .runs import parse_anneal, split_run

    main, branch = split_run(name) if isinstance(name, str) else (name, None)
    if isinstance(main, str) and RUN_NAME.fullmatch(main) and (branch is None or parse_anneal(branch)):
        return []
    return [f"{what}={name!r} must be a plain name without '/': 1-{RUN_NAME_MAX} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a folder and a store prefix); or a cooldown branch's, "
            "RUN/branches/anneal-STEP-TOKENS"]


def branch_problems(cfg: Config) -> list[str]:
    """A cooldown branch's name is its definition: its config must have the horizon and the cooldown it names
    (``baton anneal`` derives them; a config written by hand that disagrees would train another branch)."""
    from .runs import parse_anneal, split_run

    _, branch = split_run(cfg.run.name)
    at = parse_anneal(branch) if branch else None
    tps = cfg.tokens_per_step
    if at is None or tps <= 0:
        return []
    step, tokens = at
    if tokens % tps:
        return [f"run.name={cfg.run.name!r}: its {tokens} tokens are not whole steps of {tps} tokens (a branch "
                "trains whole steps: use the name `baton anneal` gives it)"]
    want = {"optim.schedule": ("wsd", cfg.optim.schedule), "optim.decay_step": (step, cfg.optim.decay_step),
            "train.steps": (step + tokens // tps, cfg.total_steps)}
    wrong = [f"{k} = {json.dumps(w)} (not {json.dumps(v)})" for k, (w, v) in want.items() if w != v]
    if wrong:
        return [f"run.name={cfg.run.name!r} names the cooldown branch from step {step} over {tokens:,} tokens: it "
                f"needs {', '.join(wrong)}; `baton anneal` sets them (and `--branch NAME` on other commands)"]
    return []


# A portable file name (POSIX's character set), short enough for the suffixes baton adds on any file system.
RUN_NAME_MAX = 100
RUN_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_NAME_MAX - 1}}}")


def _url_problems(key: str, url: str, env: str) -> list[str]:
    """No URL carries credentials: named, never echoed (the config is printed, logged and saved in every
    checkpoint), with the variables that hold them instead. (That the URL splits at all is guard's.)"""
    from .guard import has_credentials

    if url and has_credentials(url, key):
        return [f"{key} must not carry credentials (user:password@); set {env} in the environment instead"]
    return []


def _divisors_near(n: int, k: int, ok: Callable[[int], bool] = lambda x: True) -> str:
    # The three divisors nearest k that ``ok`` takes, searched outward from k and bounded: a huge (mistyped) n
    # must not make validation hang.
    found: list[int] = []
    k = min(k, n)
    for d in range(4096):
        for x in (k - d, k + d) if d else (k,):
            if 1 <= x <= n and n % x == 0 and ok(x) and len(found) < 3:
                found.append(x)
    return ", ".join(str(x) for x in sorted(found))


def reference_table() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every field, from the fields' types and metadata; the reference table of
    docs/configuration.md."""
    rows: list[tuple[str, str, str, str]] = []
    for section, cls in [*_hints(Config).items(), ("data.sources[]", SourceConfig)]:
        default = cls()
        for f in dataclasses.fields(cls):
            tp, value, bounds = _hints(cls)[f.name], getattr(default, f.name), f.metadata["bounds"]
            shown = "[…]" if isinstance(value, list) else json.dumps(value)
            kind = _type_name(tp) + (f", {_bounds_text(bounds)}" if bounds else "")
            rows.append((f"{section}.{f.name}", kind, shown, f.metadata["help"]))
    return rows
