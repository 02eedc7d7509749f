"""The model card of a published model: Hub YAML metadata (license, tags, datasets, model-index with the
evaluation results) and a body saying what the model is, what it was trained on, at what cost, how well it
scores and how to load it; plus the loss-curve image it shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .. import extras
from ..evaluate.record import EvalRecord

LOSS_CURVE = "loss_curve.png"
LM_EVAL_URL = "https://github.com/EleutherAI/lm-evaluation-harness"


def loss_curve(metrics: Path, out: Path, heldout: float | None = None) -> Path | None:
    """Training loss per step from a metrics.jsonl (the held-out loss as a point at the last step); None when
    there is no history or no matplotlib."""
    try:
        rows = [json.loads(x) for x in metrics.read_text(encoding="utf-8").splitlines() if x.strip()]
        plt = extras.pyplot("the model card's loss plot") if extras.available("matplotlib") else None
    except (OSError, ValueError):
        return None
    if plt is None:
        return None
    pts = [(r["step"], r["loss"]) for r in rows
           if isinstance(r, dict) and isinstance(r.get("loss"), (int, float)) and type(r.get("step")) is int]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(*zip(*pts), lw=1, label="training loss")
    if heldout is not None:
        ax.scatter([pts[-1][0]], [heldout], color="C3", zorder=3, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _results(model_name: str, ev: EvalRecord) -> list[EvalResult]:
    out = []
    h = ev.heldout
    held = f"held-out windows of run {ev.run}"
    for metric in ("loss", "bits_per_byte", "ppl"):
        if metric in h:
            out.append(EvalResult(task_type="text-generation", dataset_type="baton-heldout", dataset_name=held,
                                  metric_type=metric, metric_value=round(float(h[metric]), 6)))
    for name, r in ev.files.items():
        for metric in ("loss", "bits_per_byte"):
            if metric in r:
                out.append(EvalResult(task_type="text-generation", dataset_type="text-file", dataset_name=name,
                                      metric_type=metric, metric_value=round(float(r[metric]), 6)))
    for task, metrics in ev.tasks.items():
        for metric, value in metrics.items():
            # huggingface_hub refuses a source name without its URL (ValueError)
            out.append(EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task,
                                  metric_type=metric, metric_value=round(float(value), 6),
                                  source_name="lm-evaluation-harness", source_url=LM_EVAL_URL))
    return out


def limitations(*, step: int, horizon: int, params: int, tokens_seen: int, seq_len: int, tasks: bool) -> str:
    """What the model is not, said from the run's own numbers."""
    out = [f"- A base model of {params:,} parameters pretrained from scratch on {tokens_seen:,} tokens: it continues "
           "text. It is not instruction-tuned or aligned, has no chat template, and was not evaluated for safety, "
           "bias or factual accuracy; its output can be wrong, repetitive or offensive, and mirrors its training "
           "data (the sources above)."]
    if step < horizon:
        out.append(f"- An intermediate checkpoint: step {step:,} of the run's {horizon:,}-step horizon, before the "
                   "end of its learning-rate schedule.")
    out.append(f"- Trained on windows of {seq_len:,} tokens: longer inputs are beyond anything it was trained on.")
    out.append("- The held-out windows come from the same corpus as the training data, so their loss measures fit "
               "to that distribution, not quality on other text" + ("." if tasks else
                                                                    " or on downstream tasks (none were run)."))
    return "\n".join(out)


def _source(s: dict[str, Any]) -> str:
    """What a data source read, as the card names it."""
    if s.get("kind") == "hub":
        what = s.get("files") or (f"config {s['config']}, split {s.get('split', 'train')}" if s.get("config") else "")
        return f"{s.get('repo')}@{s.get('revision', 'main')}" + (f" ({what})" if what else "")
    if s.get("kind") == "stdlib":
        return "(the Python standard library)"
    return str(s.get("path") or "(local files)")


def build_card(*, repo: str, run: str, step: int, horizon: int, params: int, tokens_seen: int, config: dict[str, Any],
               manifest: dict[str, Any], ledger: dict[str, Any], evaluation: EvalRecord, license: str,
               tags: list[str], curve: str | None, revision: str = "") -> ModelCard:
    model_cfg = config["model"]
    # The Hub's dataset ids the run read (kind hub); a saved dataset folder (hf_dataset) is a local path, not a
    # Hub id, so not metadata.
    datasets = sorted({s["repo"] for s in config["data"]["sources"] if s.get("kind") == "hub" and s.get("repo")})
    data = ModelCardData(license=license or None, library_name="transformers", pipeline_tag="text-generation",
                         tags=["baton", "llama", "text-generation", *tags], datasets=datasets or None,
                         model_name=repo, eval_results=_results(repo, evaluation) or None)
    sources = "\n".join(f"  - {s['kind']}: {_source(s)}"
                        + (f" (weight {s['weight']:g})" if s.get("weight", 1.0) != 1.0 else "")
                        for s in config["data"]["sources"])
    h = evaluation.heldout
    rows = [("held-out windows", h)] + list(evaluation.files.items())
    table = "\n".join(f"| {n} | {r['loss']:.4f} | {r['bits_per_byte']:.4f} | {r['tokens']:,} |" for n, r in rows if r)
    tasks = "\n".join(f"| {t} | {m} | {v:.4f} |" for t, ms in evaluation.tasks.items()
                      for m, v in ms.items())
    hours = ledger.get("billed_hours")
    devices = ledger.get("devices") or []
    # A run on CPUs only has billed CPU hours; calling them GPU-hours would misstate the cost.
    unit = "CPU hours" if devices and all(d.endswith(" cpu") for d in devices) else "GPU-hours"
    body = f"""
# {repo.split('/')[-1]}

A Llama-architecture causal language model pretrained from scratch with baton (run `{run}`, step {step:,}).
It is a plain `LlamaForCausalLM`: it loads with transformers alone, no custom code.

## Model

- architecture: Llama, {model_cfg['n_layers']} layers, hidden {model_cfg['hidden']}, {model_cfg['n_heads']} heads \
({model_cfg['n_kv_heads']} key/value heads), SwiGLU {model_cfg['ffn']}, RoPE theta {model_cfg['rope_theta']:g}, \
vocabulary {model_cfg['vocab_size']:,}{', tied embeddings' if model_cfg.get('tie_embeddings') else ''}
- parameters: {params:,}
- context length: {config['data']['seq_len']:,} tokens in training

## Training data

- tokens seen: {tokens_seen:,} ({step:,} steps of {config['train']['global_batch']} x {config['data']['seq_len']} tokens)
- corpus: {manifest.get('total_tokens', 0):,} tokens, fingerprint `{manifest.get('fingerprint', 'unknown')}`
- tokenizer: {manifest.get('tokenizer', {}).get('vocab_size', '?')} tokens, end-of-text `{manifest.get('tokenizer', {}).get('eos_token', '?')}`
- sources:
{sources}

## Compute

- hardware: {', '.join(devices) or 'unknown'}
- {unit} billed to the run so far (wall clock x accelerators, from its ledger; the whole run and its cooldown branches, not only up to this step): {f'{hours:.4f}' if hours is not None else 'unknown'} over {ledger.get('sessions', 0)} session(s)

{f'![training loss]({curve})' if curve else ''}

## Evaluation

| data | loss (nats/token) | bits per byte | tokens |
|---|---|---|---|
{table}
{f'''
lm-evaluation-harness:

| task | metric | value |
|---|---|---|
{tasks}
''' if tasks else ''}
## Limitations

{limitations(step=step, horizon=horizon, params=params, tokens_seen=tokens_seen, seq_len=config['data']['seq_len'],
             tasks=bool(evaluation.tasks))}

## How to use

```python
from transformers import pipeline

generate = pipeline("text-generation", model="{repo}"{f', revision="{revision}"' if revision else ''})
print(generate("def ", max_new_tokens=32)[0]["generated_text"])
```

## Training configuration

```json
{json.dumps(config, indent=1, sort_keys=True)}
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
