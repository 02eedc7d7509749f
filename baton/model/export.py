"""Export a trained model as a Hugging Face folder that `from_pretrained` loads, and generate from it."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from ..checkpoint.record import CheckpointState
from ..config import ModelConfig
from ..errors import BatonError


def export_model(model: torch.nn.Module, tokenizer_file: Path, out: Path, eos_token: str,
                 meta: dict[str, Any] | None = None) -> Path:
    model = getattr(model, "module", model)
    out.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(model.config)
    from ..data.tokenize import load_tokenizer

    eos_id = load_tokenizer(tokenizer_file).token_to_id(eos_token)
    cfg.use_cache = True  # training turns the KV cache off; generation wants it
    cfg.eos_token_id = cfg.bos_token_id = eos_id
    cfg.pad_token_id = None
    original = model.config
    try:
        model.config = cfg
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.eos_token_id = eos_id
            model.generation_config.bos_token_id = eos_id
        # Llama's weights are saved under the names they have: transformers' table of renamings (built for every
        # model family it knows, seconds of regular expressions) has nothing to revert for them.
        with library_bars_off():
            model.save_pretrained(str(out), save_original_format=False)
    finally:
        model.config = original
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), eos_token=eos_token, bos_token=eos_token)
    tok.save_pretrained(str(out))
    (out / "baton.json").write_text(json.dumps(meta or {}, indent=1), encoding="utf-8")
    return out


MIN_TEMPERATURE = 1e-3


@contextmanager
def library_bars_off() -> Iterator[None]:
    """transformers' own progress bars ("Writing model shards", "Loading weights") off for the call: baton says
    what it wrote or loaded in its own lines, and --no-progress must leave no bar on the terminal or in a log."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    # transformers' switch turns huggingface_hub's bars with it: both come back as they were (a Hub store has
    # turned the library's off for the process).
    was, hub_was_off = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
        if hub_was_off:
            disable_progress_bars()


def generate(folder: Path, prompt: str, max_new_tokens: int = 64, temperature: float = 0.8, seed: int = 0) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if 0 < temperature < MIN_TEMPERATURE:
        # Logits divided by it overflow to inf, and sampling from that is NaN: what is meant is greedy decoding.
        raise BatonError(f"--temperature {temperature:g} is too small to sample with (at least {MIN_TEMPERATURE:g}); "
                         "use 0 for greedy decoding")
    if not (folder / "config.json").is_file():
        raise BatonError(f"{folder} is not an exported model folder (run `baton export` first)")
    if not any((folder / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        raise BatonError(f"{folder} holds no model.safetensors: baton loads weights only from safetensors, never "
                         "from pickle (.bin) files (export the model with `baton export`)")
    from safetensors import safe_open

    from ..reads import reading

    fix = "export the model again with `baton export --force`"
    for weights in sorted(folder.glob("*.safetensors")):  # a cut copy is named by its file, not by its folder
        with reading(weights, "exported model folder's weights file", fix), safe_open(str(weights), "pt"):
            pass
    # transformers raises a different type for every way a folder can be damaged; only the loads are wrapped.
    with reading(folder, "exported model folder", fix, also=(Exception,)), library_bars_off():
        tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True)
    model.eval()
    torch.manual_seed(seed)
    ids = tok(prompt or tok.eos_token, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=50 if temperature > 0 else None,
                             pad_token_id=tok.eos_token_id)
    return tok.decode(out[0], skip_special_tokens=False)


def checkpoint_model(cfg, source: str, tmp: Path, step: int | None = None) -> tuple[torch.nn.Module, CheckpointState]:
    """The model of a verified checkpoint in the store (``source='store'``; ``step`` None: the pointer's) or of a
    local checkpoint folder, on the CPU, with the checkpoint's state."""
    from ..checkpoint.history import locate
    from ..checkpoint.names import STATE_FILE
    from ..checkpoint.pull import pull_checkpoint
    from ..checkpoint.record import read_state
    from ..checkpoint.state import load_weights
    from ..config import config_from_dict
    from ..store import RetryPolicy, open_store
    from .llama import build_model

    if source == "store":
        store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
        folder = pull_checkpoint(store, cfg.run.name, locate(store, cfg.run.name, step), tmp / "ckpt")
    else:
        if step is not None:
            raise BatonError("--step picks a checkpoint in the store; it cannot be combined with --from FOLDER")
        from ..guard import path_value, shown

        folder = path_value(source, "--from", "use 'store' or a folder")
        if not folder.is_dir():
            raise BatonError(f"--from {shown(source)}: no such checkpoint folder (use 'store' or a folder)")
        if not (folder / STATE_FILE).is_file():  # said for --from, not with a training session's fixes
            raise BatonError(f"--from {shown(source)} holds no {STATE_FILE}: not a baton checkpoint folder (give a "
                             "checkpoint folder, runs/<name>/ckpt/step-N or one downloaded from the store, or 'store')")
    state = read_state(folder)
    if step is not None and state.step != step:
        raise BatonError(f"the checkpoint at step {step} holds the state of step {state.step}: the store is damaged")
    model = build_model(portable(config_from_dict(state.config).model), "cpu")
    load_weights(folder, model)
    return model, state


def portable(m: ModelConfig) -> ModelConfig:
    """The saved model with an attention every machine runs. FlashAttention-2 and SDPA compute the same
    function of the same weights (SDPA picks a flash kernel itself where the GPU has one), while flash-attn
    is a CUDA-only package that the machine exporting, evaluating or publishing a run often lacks; "auto" says
    what to choose on a device, and an exported folder names what it runs."""
    return dataclasses.replace(m, attn="sdpa") if m.attn in ("flash_attention_2", "auto") else m


def export_run(cfg, source: str, out: Path, step: int | None = None) -> Path:
    """Export the run's latest verified checkpoint (``source='store'``), the verified one at ``step``, or a
    local checkpoint folder."""
    import tempfile

    from ..data.manifest import load_manifest
    from ..data.prepare import TOKENIZER_FILE

    with tempfile.TemporaryDirectory(prefix="baton-export-") as tmp:
        model, state = checkpoint_model(cfg, source, Path(tmp), step)
        manifest = load_manifest(cfg.data.dir)
        return export_model(model, Path(cfg.data.dir) / TOKENIZER_FILE, out, manifest["tokenizer"]["eos_token"],
                            meta={"run": cfg.run.name, "step": state.step, "config": state.config})
