"""The exported folder is a plain Hugging Face model: it loads, generates, and scores like baton said."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from baton.data.reader import WindowDataset


def test_export_loads_generates_and_matches_val_loss(make_config, baton_cli, tmp_path, prepared_data):
    cfg = str(make_config())
    # --no-progress leaves no bar, transformers' own included (the final export writes "model shards")
    trained = baton_cli("train", "-c", cfg, "--no-progress", check=True)
    assert "%|" not in trained.stderr, trained.stderr[-2000:]
    summary = json.loads((tmp_path / "runs" / "test" / "run_summary.json").read_text())

    out = tmp_path / "exported"
    exported = baton_cli("export", "-c", cfg, "--out", str(out), check=True)  # from the store's verified checkpoint
    assert "%|" not in exported.stderr, exported.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(out))

    ds = WindowDataset(prepared_data, 32, 7, 16)
    losses = []
    with torch.no_grad():
        for i in ds.val_window_ids():
            x, y = ds.windows([i])
            full = torch.cat([x, y[:, -1:]], dim=1)  # the L+1 tokens; transformers shifts labels itself
            losses.append(float(model(input_ids=full, labels=full).loss))
    hf_val = sum(losses) / len(losses)
    assert abs(hf_val - summary["val_loss"]) < 1e-4, (hf_val, summary["val_loss"])

    ids = tok("def ", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    assert gen.shape[1] > ids.shape[1]

    p = baton_cli("sample", "--from", str(out), "--prompt", "import ", "--max-new-tokens", "8", check=True)
    assert p.stdout.startswith("import ")
    assert "%|" not in p.stderr, p.stderr[-2000:]  # no "Loading weights" bar before the sample


def test_run_summary_has_the_promised_fields(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    baton_cli("train", "-c", cfg, "--no-progress", "--set", "train.ckpt_every=10", check=True)
    s = json.loads((tmp_path / "runs" / "test" / "run_summary.json").read_text())
    for key in ("params", "steps_done", "total_steps", "tokens_consumed", "samples_consumed", "final_train_loss",
                "val_loss", "val_ppl", "tokens_per_s", "peak_memory_bytes", "checkpoints", "resumed_from_step",
                "config", "versions"):
        assert key in s, key
    assert s["steps_done"] == s["total_steps"] == 20
    assert s["samples_consumed"] == 20 * 8 and s["tokens_consumed"] == 20 * 8 * 32
    assert [c["step"] for c in s["checkpoints"]] == [10, 20]
    assert all(c["verified"] and c["samples_consumed"] == c["step"] * 8 for c in s["checkpoints"])
    assert s["resumed_from_step"] is None and s["peak_memory_bytes"] > 0
    assert s["config"]["model"]["hidden"] == 64 and s["versions"]["torch"]
    rows = [json.loads(x) for x in (tmp_path / "runs" / "test" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all({"loss", "lr", "grad_norm", "tokens_per_s", "samples_consumed"} <= r.keys() for r in rows)
    # keep_last=2 in the store: only the two newest verified checkpoints remain
    assert sorted(p.name for p in (tmp_path / "store" / "test" / "ckpt").iterdir()) == ["step-10", "step-20"]
    # local copies were pruned after verification
    assert not any((tmp_path / "runs" / "test" / "ckpt").glob("step-*"))


def test_a_flash_attention_2_run_exports_and_evaluates_without_flash_attn(make_config, baton_cli, tmp_path):
    # Trained where flash-attn runs, exported and evaluated where it is absent (this machine): the weights are
    # the same, built with SDPA. The checkpoint is the run's own, with the attention its config names changed.
    import shutil

    from baton.config import load_config
    from baton.evaluate.run import Plan, evaluate_model
    from baton.model.export import checkpoint_model

    cfg = str(make_config())
    baton_cli("train", "-c", cfg, "--no-progress", "--stop-after-steps", "4", check=True)
    pointer = json.loads((tmp_path / "store" / "test" / "latest.json").read_text())
    folder = tmp_path / "flash-ckpt"
    shutil.copytree(tmp_path / "store" / "test" / pointer["path"], folder)
    state = json.loads((folder / "state.json").read_text())
    state["config"]["model"]["attn"] = "flash_attention_2"
    (folder / "state.json").write_text(json.dumps(state))

    out = tmp_path / "exported"
    p = baton_cli("export", "-c", cfg, "--from", str(folder), "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    exported = AutoModelForCausalLM.from_pretrained(str(out))
    model, saved = checkpoint_model(load_config(cfg), str(folder), tmp_path / "tmp")
    assert model.config._attn_implementation == "sdpa" and saved.config["model"]["attn"] == "flash_attention_2"
    for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(exported.state_dict().items())):
        assert k == k2 and torch.equal(a, b)
    # The evaluation of the checkpoint runs on that model too (baton eval and baton publish build it this way).
    record = evaluate_model(load_config(cfg), Plan(load_config(cfg)), model, saved.step, saved.config, None)
    assert record.heldout["windows"] == 16 and record.heldout["loss"] > 0


def test_the_library_bars_come_back_as_they_were():
    """transformers' switch turns huggingface_hub's bars too: a Hub store's 'off' must outlive an export."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    from baton.model.export import library_bars_off

    try:
        for hub_off in (True, False):
            hf_logging.enable_progress_bar()
            disable_progress_bars() if hub_off else enable_progress_bars()
            with library_bars_off():
                assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
            assert hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled() == hub_off
    finally:
        hf_logging.enable_progress_bar()
