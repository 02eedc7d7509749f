"""Typed, nested, self-validating configuration: TOML in, dotted ``--set`` overrides, JSON out.

Every field's docstring-comment is the reference for it (docs/configuration.md's reference table is generated
from the same dataclasses). Validation collects every problem before raising, so a user fixes a config in
one pass instead of one error per run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib  # novermin: imported only where the standard library has it
else:  # Python 3.10: the same parser, as the tomli package (a dependency there)
    import tomli as tomllib

ATTN_IMPLS = ("eager", "sdpa", "flash_attention_2")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
SCHEDULES = ("wsd", "cosine", "linear")  # optim.schedule (model.schedule computes each)
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")  # optim.decay_shape, the wsd cooldown
PARALLEL = ("ddp", "fsdp")
# liger's fused head writes the logits' gradient in fp16 before the GradScaler's scale applies
# (baton.runtime.fused_ce): said by the config check when both are set, and by autotune when auto chose fp16.
FUSED_CE_FP16 = ("train.fused_ce=true does not run under precision fp16: the fused kernel makes the logits' gradient "
                 "in fp16 before the loss scale applies, and most of it rounds to zero (set train.fused_ce = \"auto\" "
                 "or false, or train.precision = \"bf16\" on an Ampere or newer GPU)")
OPTIMIZERS = ("adamw", "muon")  # optim.name (baton.model.optimizer builds each)
MUON_ADJUST_LR = ("original", "match_rms_adamw", "spectral_unclamped")  # torch.optim.Muon's adjust_lr_fn
SOURCE_KINDS = ("stdlib", "text", "jsonl", "parquet", "hf_dataset")
SPIKE_POLICIES = ("log", "rollback", "stop")
REQUEUE_MODES = ("auto", "off")  # train.requeue (baton.runtime.slurm)
# train.slurm_signal: each is a stop signal of the session, passed on by the launcher and by torchrun.
WARNING_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
MAX_STORE_RETRIES = 100  # store.retries
MAX_STORE_RETRY_SECONDS = 86400.0  # store.retry_seconds: a day, longer than any session
MAX_STORE_REQUEST_TIMEOUT = 3600.0  # store.request_timeout: an hour of silence is a dead connection


@dataclass
class ModelConfig:
    """The Llama shape (transformers' ``LlamaForCausalLM``)."""

    n_layers: int = 4  # transformer blocks
    hidden: int = 128  # model width; must be divisible by n_heads
    n_heads: int = 4  # attention heads
    n_kv_heads: int = 2  # key/value heads (GQA); must divide n_heads
    ffn: int = 384  # SwiGLU inner width
    vocab_size: int = 4096  # embedding rows; must be >= the tokenizer's vocabulary
    tie_embeddings: bool = True  # share the input embedding with the output head
    rope_theta: float = 10000.0  # RoPE base
    max_seq_len: int = 2048  # position limit; must be >= data.seq_len
    attn: str = "sdpa"  # eager | sdpa | flash_attention_2
    grad_ckpt: bool = False  # activation (gradient) checkpointing
    init_std: float = 0.02  # weight init standard deviation
    norm_eps: float = 1e-5  # RMSNorm epsilon


@dataclass
class SourceConfig:
    """One input of the data mix."""

    kind: str = "text"  # stdlib | text | jsonl | parquet | hf_dataset
    path: str = ""  # file, folder or glob (unused for stdlib)
    field: str = "text"  # JSONL field / Parquet column / dataset column holding the text
    max_bytes: int = 0  # cap on bytes of text read from this source (0 = no cap)
    max_tokens: int = 0  # cap on tokens taken from this source (0 = no cap)
    weight: float = 1.0  # repeat factor in the mix (fractional part: a seeded share of documents)


@dataclass
class DataConfig:
    """Prepared token shards and how the reader cuts and orders them."""

    dir: str = "data/tiny"  # where `baton prepare` writes shards and `baton train` reads them
    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig(kind="stdlib")])  # [[data.sources]] tables (fields: data.sources[].*)
    tokenizer: str = ""  # tokenizer.json or a local HF tokenizer folder; "" trains a byte-level BPE
    tokenizer_vocab: int = 4096  # vocabulary size when baton trains the tokenizer
    shard_tokens: int = 16_777_216  # tokens per shard file
    seq_len: int = 128  # tokens per training window
    shuffle_seed: int = 1234  # seed of the global window permutation
    val_windows: int = 32  # held-out windows for validation (taken from the end of the stream)
    prepare_workers: int = 0  # encoding processes for prepare (0 = one per core on large corpora, 1 = in-process)
    decontaminate: list[str] = field(default_factory=list)  # evaluation text files/globs: drop training documents sharing an n-gram with them
    decontam_ngram: int = 13  # n-gram length in tokens for decontaminate
    url: str = ""  # where the prepared dataset is published: path, file://, s3:// or hf://datasets/owner/name ("" = data.dir only); train pulls it into data.dir
    transfer_workers: int = 4  # files uploaded or downloaded at once by publish-data and the pull before training


@dataclass
class OptimConfig:
    """The optimizer (AdamW, or Muon for the blocks' matrices) and the learning-rate schedule (baton.model.schedule)."""

    name: str = "adamw"  # adamw | muon (Muon for the 2-D matrices inside the blocks, AdamW for the rest); fixed for a run
    lr: float = 3e-4  # peak learning rate
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.95  # AdamW second-moment decay
    eps: float = 1e-8  # AdamW denominator epsilon
    weight_decay: float = 0.1  # applied to matrices only, not to norms
    grad_clip: float = 1.0  # max global gradient norm (0 = off)
    warmup_steps: int = 100  # linear warmup length in optimizer steps
    decay_start: float = 0.8  # fraction of the horizon where the wsd cooldown begins
    schedule: str = "wsd"  # wsd (warmup, plateau, cooldown) | cosine | linear (both decay from the warmup's end)
    decay_shape: str = "linear"  # the wsd cooldown's shape: linear | cosine | 1-sqrt
    min_lr_ratio: float = 0.0  # the floor the decay falls towards, as a fraction of optim.lr, in [0, 1)
    muon_lr: float = 0.02  # Muon's peak learning rate; the schedule scales it by the same factor as optim.lr
    muon_momentum: float = 0.95  # Muon's momentum, in [0, 1)
    muon_nesterov: bool = True  # Nesterov momentum for Muon
    muon_ns_steps: int = 5  # Newton-Schulz iterations per Muon step, 1-99
    muon_adjust_lr: str = "original"  # Muon's per-matrix lr scaling: original | match_rms_adamw | spectral_unclamped
    muon_weight_decay: float = 0.0  # Muon's decoupled weight decay (param *= 1 - lr x decay each step)


@dataclass
class TrainConfig:
    """The horizon, batch geometry, precision and cadence."""

    steps: int = 1000  # horizon in optimizer steps (set 0 to use target_tokens)
    target_tokens: int = 0  # horizon in tokens; steps = target_tokens // tokens_per_step
    micro_batch: int | str = 4  # samples per rank per forward/backward, or "auto" (largest that fits the GPU)
    global_batch: int = 16  # samples per optimizer step over all ranks (accumulation is derived)
    precision: str = "fp32"  # fp32 | bf16 | fp16 (+ GradScaler) | auto (bf16 Ampere+, fp16 older GPUs, fp32 CPU)
    compile: bool | str = "auto"  # torch.compile model + loss: auto (on for CUDA, off on CPU) | true | false
    fused_ce: bool | str = "auto"  # output head + cross-entropy in one kernel (liger-kernel): auto (CUDA, if installed, not fp16) | true | false
    deterministic: bool = False  # deterministic kernels + fixed cuBLAS workspace: bit-identical resume on CUDA, costs speed
    device: str = "auto"  # auto | cpu | cuda | cuda:N (that GPU, in a single process)
    seed: int = 0  # model init and dropout-free RNG seed
    threads: int = 0  # torch CPU threads (0 = torch's default)
    ckpt_every: int = 0  # also checkpoint every N steps (0 = only at the end of the session)
    log_every: int = 10  # progress/metrics cadence in steps (metrics.jsonl gets every step)
    max_nonfinite: int = 5  # consecutive skipped (non-finite) steps before the run stops
    parallel: str = "ddp"  # ddp (a replica per rank) | fsdp (fully_shard: weights, grads, moments sharded)
    dist_timeout: int = 600  # seconds a rank waits in a collective before failing (bounds a hang)
    spike_policy: str = "log"  # on a loss spike: log | rollback (to the checkpoint before it, skipping its data) | stop
    spike_threshold: float = 6.0  # a spike: loss above the window's median by this many robust sigmas (1.4826 x MAD)
    spike_window: int = 50  # recent losses the spike threshold is measured on (no verdict before it is full)
    spike_skip_windows: int = 0  # windows skipped on a rollback, ending with the spiking batch (0 = its global batch)
    max_rollbacks: int = 3  # rollbacks a run may make; one more spike ends the run
    eval_every: int = 0  # also evaluate the held-out windows every N steps (0 = only at the end of the run)
    requeue: str = "auto"  # in a SLURM batch job: auto (a session stopped by time or a signal, the run not complete, requeues its job after the verified push) | off
    max_requeues: int = 20  # auto requeue stops once the job was requeued this many times (SLURM_RESTART_COUNT)
    slurm_signal: str = "USR1"  # SLURM's warning signal (sbatch --signal=B:USR1@600): checkpoint and stop, as on SIGTERM; USR1 | USR2 | TERM | INT | HUP


@dataclass
class StoreConfig:
    """Where verified checkpoints live: a local folder, s3://bucket/prefix or hf://owner/repo."""

    url: str = "store"  # local path, file://, s3:// or hf://
    keep_last: int = 2  # verified checkpoints kept in the store
    verify: str = "sample"  # sample (listing + ranged windows) | full (reread every byte)
    async_push: bool = True  # upload + verify in the background while training goes on (one at a time)
    retries: int = 6  # attempts per store call on transient errors (timeouts, resets, 429, 5xx); 1 to 100
    retry_seconds: float = 300.0  # no retry starts after this long; then the push fails; up to 86400 (a day)
    request_timeout: float = 120.0  # seconds an S3/Hub request may wait on a silent server, then retried; up to 3600


@dataclass
class BudgetConfig:
    """Time and quota: when a session must stop, how hours are billed, what the quota allows."""

    session_hours: float = 0.0  # stop in time to checkpoint within H hours of `baton train` starting (0 = no limit)
    margin_minutes: float = 5.0  # kept free before the deadline, on top of the measured step and checkpoint times
    ckpt_minutes: float | str = 0.0  # also checkpoint when M minutes passed since the last one began (0 = step cadence only; "auto" = chosen from the ledger's interruptions and checkpoint times)
    ckpt_seconds: float = 0.0  # expected checkpoint cycle before one is measured (0 = a slow guess from the model size)
    startup_minutes: float = 0.0  # plan: time per session before the first step (install, pull, build)
    heartbeat_minutes: float = 10.0  # ledger heartbeat between checkpoints (0 = at checkpoints only)
    bill_factor: float = 0.0  # billed hours per wall-clock hour (0 = one per rank; 1 for a platform that bills the machine)
    quota_hours: float = 0.0  # billed hours allowed per quota period (0 = no quota)
    quota_period_days: float = 7.0  # length of a quota period
    quota_reset: str = ""  # an instant at which the quota resets, recurring every period (e.g. 2026-09-26T00:00Z)
    cap_hours: float = 0.0  # cap on the billed hours of this run, e.g. a budget for tests (0 = none)
    tripwires: list[str] = field(default_factory=list)  # 'RATE: target=0.9B' or 'RATE: micro=8, accum=16'


@dataclass
class LogConfig:
    """Where the metrics go besides metrics.jsonl (always written: it travels in every checkpoint)."""

    backends: list[str] = field(default_factory=lambda: ["jsonl"])  # any of jsonl, tensorboard, wandb, mlflow (rank 0 logs)
    project: str = "baton"  # W&B project; also the MLflow experiment unless log.experiment is set
    entity: str = ""  # W&B entity (team or user; "" = the account's default)
    experiment: str = ""  # MLflow experiment name ("" = log.project)
    run_name: str = ""  # the tracker run's display name ("" = run.name)
    mlflow_uri: str = ""  # MLflow tracking URI ("" = MLFLOW_TRACKING_URI, else MLflow's default); no credentials


@dataclass
class RunConfig:
    """Names the run; the store prefix and local run directory derive from it."""

    name: str = "tiny"  # run name: store prefix <name>/ and local folder <local_dir>/<name>
    local_dir: str = "runs"  # root of local run directories


@dataclass
class PublishConfig:
    """Where the finished model goes as a Hugging Face model repository (`baton publish`)."""

    url: str = ""  # hf://owner/model-repo, s3://, file:// or a path: the model at its root (empty = no publishing)
    every: int = 0  # also publish each verified checkpoint at a multiple of N steps as revision step-N (0 = off)
    license: str = "apache-2.0"  # license named in the model card's metadata
    tags: list[str] = field(default_factory=list)  # extra Hub tags for the model card


@dataclass
class EvalConfig:
    """`baton eval` beyond the held-out windows: extra files and lm-evaluation-harness tasks."""

    files: list[str] = field(default_factory=list)  # text or JSONL files scored for loss and bits per byte
    tasks: list[str] = field(default_factory=list)  # lm-evaluation-harness task names (needs the eval extra)
    task_dir: str = ""  # folder of local task YAML files for lm-eval (offline use)
    limit: int = 0  # documents per lm-eval task (0 = all)
    # Declared last: from here on the name shadows dataclasses.field in this class body.
    field: str = "text"  # JSONL field holding the text of eval.files


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
        problems = _nonfinite_problems(self) or _semantic_problems(self)
        if problems:
            raise ConfigError(_format(problems))


# --------------------------------------------------------------------------------------------------
# loading


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read TOML (or start from defaults when ``path`` is None), apply ``a.b=c`` overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        from .guard import input_file
        from .reads import reading

        p = input_file(path, "config file", "pass --config with an existing TOML file")
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


def _coerce(tp: Any, value: Any, name: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, name, problems)
    if origin is types.UnionType or origin is typing.Union:
        # A number or a keyword (micro_batch = 4 | "auto"): the first member type that accepts it wins.
        for member in typing.get_args(tp):
            trial: list[str] = []
            coerced = _coerce(member, value, name, trial)
            if not trial:
                return coerced
        names = " or ".join(getattr(m, "__name__", str(m)) for m in typing.get_args(tp))
        problems.append(f"{name} must be {names}, got {type(value).__name__} {value!r}")
        return None
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.append(f"{name} must be a list, got {type(value).__name__} {value!r}")
            return []
        return [_coerce(item_tp, v, f"{name}[{i}]", problems) for i, v in enumerate(value)]
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


def _semantic_problems(cfg: Config) -> list[str]:
    p: list[str] = []
    m, d, o, t, s = cfg.model, cfg.data, cfg.optim, cfg.train, cfg.store

    def positive(name: str, value: Any) -> bool:
        if value is None or value <= 0:
            p.append(f"{name} must be > 0, got {value}")
            return False
        return True

    shape_ok = all(
        [positive(f"model.{k}", getattr(m, k)) for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab_size")]
    )
    if shape_ok:
        if m.hidden % m.n_heads:
            p.append(
                f"model.hidden={m.hidden} is not divisible by model.n_heads={m.n_heads} "
                f"(pick n_heads among the divisors of hidden, e.g. {_divisors_near(m.hidden, m.n_heads)})"
            )
        elif (m.hidden // m.n_heads) % 2:
            p.append(f"head dim hidden/n_heads = {m.hidden // m.n_heads} must be even for RoPE")
        if m.n_heads % m.n_kv_heads:
            p.append(
                f"model.n_heads={m.n_heads} is not divisible by model.n_kv_heads={m.n_kv_heads} "
                f"(GQA needs n_kv_heads to divide n_heads, e.g. {_divisors_near(m.n_heads, m.n_kv_heads)})"
            )
    if m.attn not in ATTN_IMPLS:
        p.append(f"model.attn={m.attn!r} is not one of {', '.join(ATTN_IMPLS)}")
    if positive("data.seq_len", d.seq_len) and m.max_seq_len is not None and d.seq_len > m.max_seq_len:
        p.append(f"data.seq_len={d.seq_len} exceeds model.max_seq_len={m.max_seq_len} (raise max_seq_len)")
    positive("data.shard_tokens", d.shard_tokens)
    positive("data.decontam_ngram", d.decontam_ngram)
    if d.prepare_workers is not None and d.prepare_workers < 0:
        p.append(f"data.prepare_workers must be >= 0 (0 = automatic), got {d.prepare_workers}")
    positive("data.tokenizer_vocab", d.tokenizer_vocab)
    if d.val_windows is not None and d.val_windows < 0:
        p.append(f"data.val_windows must be >= 0, got {d.val_windows}")
    for i, src in enumerate(d.sources):
        if src.kind not in SOURCE_KINDS:
            p.append(f"data.sources[{i}].kind={src.kind!r} is not one of {', '.join(SOURCE_KINDS)}")
        elif src.kind != "stdlib" and not src.path:
            p.append(f"data.sources[{i}] ({src.kind}) needs a path")
        if src.weight is not None and src.weight <= 0:
            p.append(f"data.sources[{i}].weight must be > 0, got {src.weight}")
        for k in ("max_bytes", "max_tokens"):
            if getattr(src, k) is not None and getattr(src, k) < 0:
                p.append(f"data.sources[{i}].{k} must be >= 0 (0 = no cap), got {getattr(src, k)}")
    if not d.sources and not d.tokenizer:
        p.append("data.sources is empty (add at least one [[data.sources]] table)")
    positive("optim.lr", o.lr)
    positive("optim.eps", o.eps)
    for k in ("beta1", "beta2"):  # AdamW's decays; torch would refuse them only when the optimizer is built
        if getattr(o, k) is not None and not 0.0 <= getattr(o, k) < 1.0:
            p.append(f"optim.{k} must be in [0, 1), got {getattr(o, k)}")
    if o.weight_decay is not None and o.weight_decay < 0:
        p.append(f"optim.weight_decay must be >= 0, got {o.weight_decay}")
    for k in ("rope_theta", "init_std", "norm_eps"):
        positive(f"model.{k}", getattr(m, k))
    if o.warmup_steps is not None and o.warmup_steps < 0:
        p.append(f"optim.warmup_steps must be >= 0, got {o.warmup_steps}")
    if o.decay_start is not None and not 0.0 < o.decay_start <= 1.0:
        p.append(f"optim.decay_start must be in (0, 1], got {o.decay_start}")
    if o.schedule not in SCHEDULES:
        p.append(f"optim.schedule={o.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if o.decay_shape not in DECAY_SHAPES:
        p.append(f"optim.decay_shape={o.decay_shape!r} is not one of {', '.join(DECAY_SHAPES)}")
    if o.min_lr_ratio is not None and not 0.0 <= o.min_lr_ratio < 1.0:
        p.append(f"optim.min_lr_ratio must be in [0, 1), got {o.min_lr_ratio}")
    if o.grad_clip is not None and o.grad_clip < 0:
        p.append(f"optim.grad_clip must be >= 0, got {o.grad_clip}")
    p += _muon_problems(o, t)
    if isinstance(t.micro_batch, str):
        if t.micro_batch != "auto":
            p.append(f"train.micro_batch={t.micro_batch!r} is neither a number nor \"auto\"")
        positive("train.global_batch", t.global_batch)
    elif positive("train.micro_batch", t.micro_batch) and positive("train.global_batch", t.global_batch):
        if t.global_batch % t.micro_batch:
            p.append(
                f"train.global_batch={t.global_batch} is not a multiple of train.micro_batch={t.micro_batch}"
            )
    if t.steps is not None and t.target_tokens is not None:
        if (t.steps > 0) == (t.target_tokens > 0):
            p.append("set exactly one of train.steps and train.target_tokens (set train.steps = 0 to use target_tokens)")
        elif t.steps < 0 or t.target_tokens < 0:
            p.append("train.steps and train.target_tokens must be >= 0")
        elif t.target_tokens and d.seq_len and t.global_batch and cfg.total_steps == 0:
            p.append(
                f"train.target_tokens={t.target_tokens} is less than one step of {cfg.tokens_per_step} tokens"
            )
    if t.precision not in PRECISIONS:
        p.append(f"train.precision={t.precision!r} is not one of {', '.join(PRECISIONS)}")
    if isinstance(t.compile, str) and t.compile != "auto":
        p.append(f"train.compile={t.compile!r} is not auto, true or false")
    if isinstance(t.fused_ce, str) and t.fused_ce != "auto":
        p.append(f"train.fused_ce={t.fused_ce!r} is not auto, true or false")
    elif t.fused_ce is True and t.precision == "fp16":
        p.append(FUSED_CE_FP16)
    if t.device not in ("auto", "cpu", "cuda") and not str(t.device).startswith("cuda:"):
        p.append(f"train.device={t.device!r} is not auto, cpu or cuda")
    for k in ("ckpt_every", "threads"):
        if getattr(t, k) is not None and getattr(t, k) < 0:
            p.append(f"train.{k} must be >= 0")
    positive("train.log_every", t.log_every)
    positive("train.max_nonfinite", t.max_nonfinite)
    positive("train.dist_timeout", t.dist_timeout)
    if t.spike_policy not in SPIKE_POLICIES:
        p.append(f"train.spike_policy={t.spike_policy!r} is not one of {', '.join(SPIKE_POLICIES)}")
    positive("train.spike_threshold", t.spike_threshold)
    if t.spike_window is not None and t.spike_window < 3:
        p.append(f"train.spike_window must be >= 3 (a median and its spread need a few losses), got {t.spike_window}")
    for k in ("spike_skip_windows", "max_rollbacks"):
        if getattr(t, k) is not None and getattr(t, k) < 0:
            p.append(f"train.{k} must be >= 0, got {getattr(t, k)}")
    if t.eval_every is not None and t.eval_every < 0:
        p.append(f"train.eval_every must be >= 0 (0 = only at the end), got {t.eval_every}")
    elif t.eval_every and cfg.data.val_windows == 0:  # else it would validate nothing, silently
        p.append(f"train.eval_every={t.eval_every} needs held-out windows: set data.val_windows > 0, or "
                 "train.eval_every = 0")
    p.extend(_log_problems(cfg.log))
    p.extend(_slurm_problems(t))
    if t.parallel not in PARALLEL:
        p.append(f"train.parallel={t.parallel!r} is not one of {', '.join(PARALLEL)}")
    if s.verify not in ("sample", "full"):
        p.append(f"store.verify={s.verify!r} is not sample or full")
    positive("store.keep_last", s.keep_last)
    if positive("store.retries", s.retries) and s.retries > MAX_STORE_RETRIES:
        # A count past this is a slip, not a policy: how long retrying may last is store.retry_seconds' to bound.
        p.append(f"store.retries must be at most {MAX_STORE_RETRIES}, got {s.retries} (to retry for longer, raise "
                 "store.retry_seconds)")
    # Past these a value is a slip (an hour typed as milliseconds), and the sockets' own limits refuse it mid-run.
    if positive("store.retry_seconds", s.retry_seconds) and s.retry_seconds > MAX_STORE_RETRY_SECONDS:
        p.append(f"store.retry_seconds must be at most {MAX_STORE_RETRY_SECONDS:g} (a day), got {s.retry_seconds:g}")
    if positive("store.request_timeout", s.request_timeout) and s.request_timeout > MAX_STORE_REQUEST_TIMEOUT:
        p.append(f"store.request_timeout must be at most {MAX_STORE_REQUEST_TIMEOUT:g} seconds (an hour), got "
                 f"{s.request_timeout:g}")
    if not s.url:
        p.append("store.url is empty (a local folder, s3://bucket/prefix or hf://owner/repo)")
    elif _url_has_credentials(s.url):
        # Named, never echoed: the config is printed, logged and saved in every checkpoint.
        p.append("store.url must not carry credentials (user:password@ in the URL or in its endpoint); set "
                 "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (S3) or HF_TOKEN (Hub) in the environment instead")
    from .guard import file_url_problem

    for key, url in (("store.url", s.url), ("data.url", d.url), ("publish.url", cfg.publish.url)):
        if url and (problem := file_url_problem(url, key)):
            p.append(problem)
    p.extend(_data_url_problems(d, s))
    p.extend(_publish_problems(cfg))
    b = cfg.budget
    if isinstance(b.ckpt_minutes, str) and b.ckpt_minutes != "auto":
        p.append(f"budget.ckpt_minutes={b.ckpt_minutes!r} is neither a number of minutes nor \"auto\" (chosen from "
                 "the measured checkpoint cycle and the interruptions in the ledger)")
    for k in ("session_hours", "margin_minutes", "ckpt_minutes", "ckpt_seconds", "startup_minutes",
              "heartbeat_minutes", "bill_factor", "quota_hours", "cap_hours"):
        if isinstance(getattr(b, k), (int, float)) and getattr(b, k) < 0:
            p.append(f"budget.{k} must be >= 0, got {getattr(b, k)}")
    if b.quota_period_days is not None and b.quota_period_days <= 0:
        p.append(f"budget.quota_period_days must be > 0, got {b.quota_period_days}")
    if b.quota_hours and not b.quota_reset:
        p.append("budget.quota_hours is set but budget.quota_reset is not (e.g. quota_reset = \"2026-09-26T00:00Z\")")
    p.extend(_budget_text_problems(b))
    p.extend(run_name_problems(cfg.run.name, "run.name"))
    return p


def _muon_problems(o: OptimConfig, t: TrainConfig) -> list[str]:
    """The optimizer's name and Muon's settings (checked whichever optimizer runs: a typo is a typo)."""
    out = []
    if o.name not in OPTIMIZERS:
        out.append(f"optim.name={o.name!r} is not one of {', '.join(OPTIMIZERS)}")
    if o.muon_lr is not None and not o.muon_lr > 0:  # NaN fails this too
        out.append(f"optim.muon_lr must be > 0, got {o.muon_lr}")
    if o.muon_momentum is not None and not 0.0 <= o.muon_momentum < 1.0:
        out.append(f"optim.muon_momentum must be in [0, 1), got {o.muon_momentum}")
    if o.muon_ns_steps is not None and not 1 <= o.muon_ns_steps <= 99:  # torch refuses 100 and more
        out.append(f"optim.muon_ns_steps must be in 1-99, got {o.muon_ns_steps}")
    if o.muon_adjust_lr is not None and o.muon_adjust_lr not in MUON_ADJUST_LR:
        out.append(f"optim.muon_adjust_lr={o.muon_adjust_lr!r} is not one of {', '.join(MUON_ADJUST_LR)}")
    if o.muon_weight_decay is not None and not o.muon_weight_decay >= 0:
        out.append(f"optim.muon_weight_decay must be >= 0, got {o.muon_weight_decay}")
    if o.name == "muon" and t.parallel == "fsdp":
        # FSDP shards each matrix over the ranks; Newton-Schulz on a shard orthogonalises another matrix.
        out.append("optim.name='muon' does not work with train.parallel='fsdp' (each rank would orthogonalise a "
                   "shard of every matrix, not the matrix); use train.parallel='ddp' with muon, or optim.name='adamw'")
    return out


def _slurm_problems(t: TrainConfig) -> list[str]:
    out = []
    if t.requeue not in REQUEUE_MODES:
        out.append(f"train.requeue={t.requeue!r} is not one of {', '.join(REQUEUE_MODES)}")
    if t.max_requeues is not None and t.max_requeues < 0:
        out.append(f"train.max_requeues must be >= 0 (0 = never requeue), got {t.max_requeues}")
    if not isinstance(t.slurm_signal, str) or t.slurm_signal.upper().removeprefix("SIG") not in WARNING_SIGNALS:
        out.append(f"train.slurm_signal={t.slurm_signal!r} is not one of {', '.join(WARNING_SIGNALS)} (the signal "
                   "named in sbatch --signal=B:USR1@600)")
    return out


def _data_url_problems(d: DataConfig, s: StoreConfig) -> list[str]:
    out = []
    if d.transfer_workers is not None and not 1 <= d.transfer_workers <= 64:
        out.append(f"data.transfer_workers must be in 1..64, got {d.transfer_workers}")
    if d.url and _url_has_credentials(d.url):
        out.append("data.url must not carry credentials (user:password@); set AWS_ACCESS_KEY_ID / "
                   "AWS_SECRET_ACCESS_KEY (S3) or HF_TOKEN (Hub) in the environment instead")
    elif d.url and d.url.rstrip("/") == (s.url or "").rstrip("/"):
        # The dataset sits at the root of data.url; the checkpoint store's root holds runs.
        out.append(f"data.url is the same location as store.url ({d.url!r}); give the dataset its own folder or "
                   "prefix, e.g. s3://bucket/datasets/NAME")
    return out


def _publish_problems(cfg: Config) -> list[str]:
    out = []
    url = cfg.publish.url
    if url and "://" in url and url.split("://", 1)[0] not in ("file", "s3", "hf"):
        out.append(f"publish.url {url.split('://', 1)[0]}:// is not supported (use hf://owner/repo, s3://, file:// "
                   "or a path)")
    elif url and _url_has_credentials(url):
        out.append("publish.url must not carry credentials; set HF_TOKEN or AWS_* in the environment instead")
    if cfg.publish.every < 0:
        out.append(f"publish.every must be >= 0, got {cfg.publish.every}")
    if cfg.eval.limit < 0:
        out.append(f"eval.limit must be >= 0, got {cfg.eval.limit}")
    return out


def _log_problems(lg: LogConfig) -> list[str]:
    from .tracking.names import BACKENDS

    out = [f"log.backends: {b!r} is not one of {', '.join(BACKENDS)}" for b in lg.backends or []
           if b not in BACKENDS]
    if len(set(lg.backends or [])) != len(lg.backends or []):
        out.append(f"log.backends lists a backend twice: {lg.backends}")
    if lg.mlflow_uri and _url_has_credentials(lg.mlflow_uri):
        out.append("log.mlflow_uri must not carry credentials (user:password@); set MLFLOW_TRACKING_USERNAME / "
                   "MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN in the environment instead")
    return out


def run_name_problems(name: Any, what: str) -> list[str]:
    """A run name is a portable file name: it names a local folder and a store prefix."""
    if isinstance(name, str) and RUN_NAME.fullmatch(name):
        return []
    return [f"{what}={name!r} must be a plain name without '/': 1-{RUN_NAME_MAX} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a folder and a store prefix)"]


# A portable file name (POSIX's character set), short enough for the suffixes baton adds on any file system.
RUN_NAME_MAX = 100
RUN_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_NAME_MAX - 1}}}")


def _nonfinite_problems(cfg: Config) -> list[str]:
    """Every float key must be a finite number: NaN passes every range check (all comparisons are false)."""
    out = []

    def walk(obj: Any, where: str) -> None:
        for f in dataclasses.fields(obj):
            value, name = getattr(obj, f.name), f"{where}.{f.name}" if where else f.name
            if dataclasses.is_dataclass(value):
                walk(value, name)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if dataclasses.is_dataclass(item):
                        walk(item, f"{name}[{i}]")
            elif isinstance(value, float) and not math.isfinite(value):
                out.append(f"{name} must be a finite number, got {value}")

    walk(cfg, "")
    return out


def _budget_text_problems(b: BudgetConfig) -> list[str]:
    from .errors import BatonError
    from .planning.plan import parse_instant
    from .planning.tripwires import parse_tripwire

    out = []
    try:
        if b.quota_reset:
            parse_instant(b.quota_reset, "budget.quota_reset")
        for w in b.tripwires or []:
            parse_tripwire(w)
    except BatonError as e:
        out.append(str(e))
    return out


def _url_has_credentials(url: str) -> bool:
    from urllib.parse import parse_qs, urlsplit

    if "://" not in url:
        return False
    parts = urlsplit(url)
    urls = [parts.netloc] + [urlsplit(v).netloc for vs in parse_qs(parts.query).values() for v in vs if "://" in v]
    return any("@" in netloc for netloc in urls)


def _divisors_near(n: int, k: int) -> str:
    # The three divisors nearest k, searched outward from k and bounded: a huge (mistyped) n must not make
    # validation hang.
    found: list[int] = []
    k = min(k, n)
    for d in range(4096):
        for x in (k - d, k + d) if d else (k,):
            if 1 <= x <= n and n % x == 0 and len(found) < 3:
                found.append(x)
    return ", ".join(str(x) for x in sorted(found or [1]))


def reference_table() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every field; the reference table of docs/configuration.md."""
    import inspect

    rows: list[tuple[str, str, str, str]] = []
    for section, cls in [*_hints(Config).items(), ("data.sources[]", SourceConfig)]:
        src = inspect.getsource(cls).splitlines()
        comments = {}
        for line in src:
            stripped = line.strip()
            if ":" in stripped and "#" in stripped and not stripped.startswith(("#", '"')):
                comments[stripped.split(":", 1)[0]] = stripped.split("#", 1)[1].strip()
        default = cls()
        for name, tp in _hints(cls).items():
            value = getattr(default, name)
            shown = "[…]" if isinstance(value, list) else json.dumps(value)
            rows.append((f"{section}.{name}", getattr(tp, "__name__", str(tp)), shown, comments.get(name, "")))
    return rows
