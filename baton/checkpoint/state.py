"""What a checkpoint holds, on disk, without pickle.

- ``model.safetensors``: the fp32 master weights (tied weights stored once).
- ``optimizer.safetensors``: the optimizer's per-parameter tensors, named ``<param>::<slot>`` (AdamW's
  step, exp_avg, exp_avg_sq; Muon's momentum_buffer).
- ``state.json``: everything else under named keys (``checkpoint.record``): step, scaler, optimizer
  hyper-parameters, the RNG states of every rank, the data cursor, the resolved config, versions, counters.
- ``metrics.jsonl``: the per-step metrics so far, so the loss history survives a wiped machine.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import errno
import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from .. import faults
from ..errors import BatonError, ResumeError
from .names import METRICS_FILE, MODEL_FILE, OPTIM_FILE, REQUIRED, STATE_FILE
from .record import DAMAGED, CheckpointState, read_state

__all__ = ["METRICS_FILE", "MODEL_FILE", "OPTIM_FILE", "REQUIRED", "STATE_FILE", "CheckpointState", "read_state"]



# ------------------------------------------------------------------------------------------------ RNG


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy())


def rng_state() -> dict[str, Any]:
    """Every generator this process uses, JSON-safe."""
    # The global generator is the legacy MT19937 RandomState, whose state comes as this tuple by default
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    py_state = random.getstate()
    return {
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        "numpy": {"keys": np_state[1].tolist(), "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }


def set_rng_state(s: dict[str, Any]) -> None:
    try:
        torch.set_rng_state(_unb64(s["torch"]))
        if s.get("cuda") and torch.cuda.is_available() and len(s["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([_unb64(x) for x in s["cuda"]])
        n = s["numpy"]
        np.random.set_state(("MT19937", np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                             n["cached_gaussian"]))
        p = s["python"]
        random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, binascii.Error) as e:
        # Each library rejects a malformed state in its own way; all of them mean the same thing here.
        raise ResumeError(f"the RNG state in the checkpoint's {STATE_FILE} cannot be restored ({type(e).__name__}: "
                          f"{e}){DAMAGED}") from None


# ------------------------------------------------------------------------------------------ optimizer


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    sd = optimizer.state_dict()
    names = _param_names(model, optimizer)
    tensors: dict[str, torch.Tensor] = {}
    for idx, slots in sd["state"].items():
        for slot, value in slots.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{names[idx]}::{slot}"] = t.detach().cpu().contiguous()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, groups


def _slots_for(group: dict[str, Any]) -> frozenset[str] | None:
    """The per-parameter tensors the step of the optimizer owning ``group`` keeps, told apart by a
    hyper-parameter only that optimizer has (None: an optimizer this module does not know)."""
    if "ns_steps" in group:  # Muon
        return frozenset({"momentum_buffer"})
    if "betas" in group:  # AdamW
        return frozenset({"step", "exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if group.get("amsgrad") else ())})
    return None


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                   groups: list[dict], step: int | None = None, updates: int | None = None) -> None:
    """``step``: the checkpoint's step, the most updates an optimizer's own count may say; ``updates``: the
    updates made by then (its steps less those skipped as non-finite): any, and an empty state is a lost one."""
    names = _param_names(model, optimizer)
    index = {n: i for i, n in enumerate(names)}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    wanted = [_slots_for(g) for g in optimizer.param_groups for _ in g["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        name, sep, slot = key.rpartition("::")
        if not sep:
            raise ResumeError(f"optimizer state holds {key!r}, not a <parameter>::<slot> name{DAMAGED}")
        if name not in index:
            raise ResumeError(f"optimizer state names parameter {name!r}, which this model does not have")
        p = params[index[name]]
        # torch loads moments of another shape or dtype without a word; training would then fail or drift.
        if slot != "step" and (t.shape != p.shape or t.dtype != p.dtype):
            raise ResumeError(f"optimizer state {key!r} is {t.dtype} {tuple(t.shape)} but the parameter is {p.dtype} "
                              f"{tuple(p.shape)}{DAMAGED}")
        if slot == "step":
            # The update count Adam's bias correction divides by: one number, whole, within the run's steps.
            v = float(t) if t.dim() == 0 and t.is_floating_point() else None
            if v is None or not math.isfinite(v) or v < 0 or (step is not None and v > step) or v != int(v):
                said = f"{v:g}" if v is not None else f"{t.dtype} {tuple(t.shape)}"
                raise ResumeError(f"optimizer state {key!r} is {said}, not a count of updates from 0 to "
                                  f"{step if step is not None else 'the step'}{DAMAGED}")
        elif not bool(torch.isfinite(t).all()):
            # Training never applies a non-finite update (it skips the step): a NaN saved is damage, and resumed it
            # would end the run later as "non-finite gradients" with the wrong advice.
            raise ResumeError(f"optimizer state {key!r} holds NaN or infinite values{DAMAGED}")
        state.setdefault(index[name], {})[slot] = t
    if not state and updates:
        raise ResumeError(f"optimizer state is empty, but the checkpoint made {updates} updates (its moments are "
                          f"lost){DAMAGED}")
    if state:
        # A partial state would start some moments afresh: the run would silently differ from an unbroken one.
        lacking = next((n for i, n in enumerate(names) if i not in state), None)
        if lacking is not None:
            raise ResumeError(f"optimizer state is incomplete (nothing for parameter {lacking!r}){DAMAGED}")
        for i, slots in sorted(state.items()):
            # An optimizer this module does not know: its parameters must at least agree with each other.
            want = wanted[i] or frozenset(next(s for j, s in state.items() if wanted[j] is None))
            if set(slots) != want:
                raise ResumeError(f"optimizer state is incomplete (parameter {names[i]!r} holds {sorted(slots)}, its "
                                  f"optimizer keeps {sorted(want)}){DAMAGED}")
    if len(groups) != len(optimizer.param_groups) or any(
            len(g.get("params", ())) != len(o["params"]) for g, o in zip(groups, optimizer.param_groups)):
        raise ResumeError(f"optimizer state has {len(groups)} parameter groups of {[len(g.get('params', ())) for g in groups]} "
                          f"parameters, this optimizer {[len(o['params']) for o in optimizer.param_groups]}{DAMAGED}")
    # The hyper-parameters stay this optimizer's, built from this session's config: torch's load would put the
    # saved ones back, so a changed optim.weight_decay or beta2 (logged as a change on resume) would be ignored,
    # and a fused flag saved on a GPU would follow the state onto a CPU. Unchanged, they equal the saved ones.
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


# ----------------------------------------------------------------------------------------- save / load


class LocalSaveError(BatonError):
    """The checkpoint could not be written to the local disk: nothing reached the store. The message does not
    say what the store's pointer names: only the session knows whether there is one (it adds that)."""


def save_checkpoint(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: CheckpointState, metrics_file: Path | None) -> Path:
    """Write the checkpoint folder atomically: files go to ``out.partial`` which is renamed last. The optimizer's
    groups go into ``state`` as saved (its ``optimizer_param_groups``): a resume checks their shape against its
    own optimizer and keeps its own hyper-parameters (``load_optimizer``)."""
    faults.point("save", state.step)
    tmp = out.with_name(out.name + ".partial")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(_unwrap(model), str(tmp / MODEL_FILE))
        faults.point("save.file", state.step)
        tensors, groups = optimizer_tensors(_unwrap(model), optimizer)
        save_file(tensors, str(tmp / OPTIM_FILE))
        doc = dataclasses.replace(state, optimizer_param_groups=groups).to_json()
        (tmp / STATE_FILE).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        if metrics_file is not None and metrics_file.is_file():
            shutil.copyfile(metrics_file, tmp / METRICS_FILE)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except Exception as e:
        # The half-written folder goes, so it does not hold the space the next attempt needs. safetensors
        # reports a full disk as its own error type, not OSError: it is recognised by its text.
        shutil.rmtree(tmp, ignore_errors=True)
        text = str(e)
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text \
                or "os error 28" in text:
            raise LocalSaveError(
                f"no space left on the disk of {out.parent} to write checkpoint {out.name} (free space there, or "
                "set run.local_dir to a larger disk, then resume); nothing was pushed"
            ) from None
        if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":
            raise LocalSaveError(
                f"could not write checkpoint {out.name} to {out.parent}: {getattr(e, 'strerror', None) or e} (check "
                "that run.local_dir is writable, then resume); nothing was pushed"
            ) from None
        raise
    return out


# The safetensors header's names of the dtypes a model's weights may have.
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _misfits(path: Path, expected: dict[str, torch.Tensor]) -> list[str]:
    """Tensors in the file whose dtype or shape differ from the model's: torch would copy another dtype without
    a word (the fp32 master weights rounded), and reports another shape over many lines."""
    out = []
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            want, got = expected.get(key), f.get_slice(key)
            shape = tuple(got.get_shape())
            if want is not None and (_DTYPES.get(got.get_dtype()) != want.dtype or shape != tuple(want.shape)):
                out.append(f"{key} is {got.get_dtype()} {shape}, the model's {want.dtype} {tuple(want.shape)}")
    return out


def load_weights(ckpt: Path, model: torch.nn.Module) -> None:
    try:
        misfits = _misfits(ckpt / MODEL_FILE, _unwrap(model).state_dict())
        if misfits:
            raise ResumeError(f"{ckpt / MODEL_FILE} does not fit this model: {'; '.join(misfits[:3])}{DAMAGED}")
        missing, unexpected = load_model(_unwrap(model), str(ckpt / MODEL_FILE), strict=False)
    except ResumeError:
        raise
    except Exception as e:  # safetensors raises several types for a corrupt header/size
        # torch's shape report spans lines: the error stays one line.
        raise ResumeError(f"{ckpt / MODEL_FILE} could not be loaded into the model: {' '.join(str(e).split())}"
                          f"{DAMAGED}") from None
    bad = next((n for n, t in _unwrap(model).state_dict().items()
                if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
    if bad is not None:  # training skips a non-finite update: a NaN saved in the weights is damage
        raise ResumeError(f"{ckpt / MODEL_FILE} holds NaN or infinite values in {bad!r}{DAMAGED}")
    if missing or unexpected:
        raise ResumeError(
            f"{ckpt / MODEL_FILE} does not fit this model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}): it holds other tensors than the model it was saved from"
            f"{DAMAGED}"
        )


def load_checkpoint(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> CheckpointState:
    state = read_state(ckpt)
    load_weights(ckpt, model)
    try:
        tensors = load_file(str(ckpt / OPTIM_FILE))
    except Exception as e:
        raise ResumeError(f"{ckpt / OPTIM_FILE} could not be loaded: {e}{DAMAGED}") from None
    load_optimizer(_unwrap(model), optimizer, tensors, state.optimizer_param_groups, step=state.step,
                   updates=state.step - state.stats.nonfinite_skips)
    return state


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)
