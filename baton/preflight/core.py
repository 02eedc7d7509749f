"""The vocabulary of a preflight: checks, stage results, the context every stage reads."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, load_config

STAGES = ("construct", "data", "storage", "throughput", "resume", "stop_probe")


@dataclass
class Check:
    name: str
    ok: bool | None  # None: deliberately not checked (shown as "not proven", never as a pass)
    detail: str = ""


@dataclass
class StageResult:
    name: str
    status: str = "pass"  # pass | fail | not proven
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    artifacts: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool | None, detail: Any = "") -> bool:
        self.checks.append(Check(name, None if ok is None else bool(ok), str(detail)))
        return bool(ok)

    def finish(self) -> StageResult:
        if self.status != "not proven":
            good = self.checks and all(c.ok is not False for c in self.checks) and not self.error
            self.status = "pass" if good else "fail"
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Stand-in shape for --scale tiny: proves the pipeline in seconds on a CPU.
TINY_OVERRIDES = {
    "model.n_layers": 2, "model.hidden": 64, "model.n_heads": 4, "model.n_kv_heads": 2, "model.ffn": 128,
    "model.grad_ckpt": False, "train.global_batch": 8, "train.micro_batch": 4, "optim.warmup_steps": 2,
}


@dataclass
class Context:
    config_path: str
    overrides: list[str]
    scale: str  # tiny | real
    out: Path
    store_url: str
    leg_steps: int  # steps per resume leg
    session_hours: float
    resume_overrides: list[str] = field(default_factory=list)  # applied to every leg after the first
    cfg: Config = field(init=False)  # the configuration as the user gave it
    scaled: Config = field(init=False)  # what the stages train: the stand-in at tiny scale
    scale_overrides: list[str] = field(init=False)
    work: Path = field(init=False)
    results: dict[str, StageResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cfg = load_config(self.config_path, self.overrides)
        scale: dict[str, object] = dict(TINY_OVERRIDES) if self.scale == "tiny" else {}
        if self.scale == "tiny":
            seq = min(self.cfg.data.seq_len, 64)
            scale.update({"data.seq_len": seq, "model.max_seq_len": max(seq, 64)})
            if self.cfg.train.precision == "fp16" and not _cuda():
                scale["train.precision"] = "fp32"  # CPU stand-in: fp16 autocast is a GPU concern
        self.scale_overrides = [f"{k}={_toml(v)}" for k, v in scale.items()] + [f"store.url={self.store_url}"]
        self.scaled = load_config(self.config_path, [*self.overrides, *self.scale_overrides])
        self.work = self.out / "work"
        self.work.mkdir(parents=True, exist_ok=True)

    def run_name(self, stage: str) -> str:
        return f"{self.cfg.run.name}-preflight-{stage}"

    def leg_overrides(self, stage: str, steps: int) -> list[str]:
        return [*self.overrides, *self.scale_overrides, f"run.name={self.run_name(stage)}",
                f"run.local_dir={self.work / 'runs'}", f"train.steps={steps}", "train.target_tokens=0",
                "train.ckpt_every=0"]

    def baton(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
        """Run the real `baton` command in a fresh process, as a new session on a new machine would."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.run([sys.executable, "-m", "baton.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=env)

    def train_leg(self, stage: str, steps: int, stop_after: int, resumed: bool = False) -> subprocess.CompletedProcess:
        """One session as a fresh process; ``resumed`` legs also get the planned between-session changes."""
        # A scratch session never requeues the SLURM job that runs the preflight.
        args = ["train", "-c", self.config_path, "--no-progress", "--stop-after-steps", str(stop_after),
                "--set", "train.requeue=off"]
        for o in self.leg_overrides(stage, steps) + (self.resume_overrides if resumed else []):
            args += ["--set", o]
        return self.baton(*args)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def timed(fn):
    """Run a stage, turning any exception into a failed stage with its error (never dropped)."""

    def wrapper(ctx: Context) -> StageResult:
        t0 = time.perf_counter()
        try:
            result = fn(ctx)
        except Exception as e:  # a stage that crashes is reported as failed, with the reason
            result = StageResult(fn.__name__.removeprefix("stage_"), error=f"{type(e).__name__}: {e}")
        result.seconds = round(time.perf_counter() - t0, 3)
        return result.finish()

    wrapper.__name__ = fn.__name__
    return wrapper


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
