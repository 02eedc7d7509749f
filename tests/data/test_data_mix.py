"""Acceptance of the data layer on a real mix: JSONL + Parquet + a text folder prepare, verify and train;
the fingerprint is a function of the content alone."""

from __future__ import annotations

import json
import math
import shutil

from baton.config import load_config
from baton.data.manifest import load_manifest
from baton.data.prepare import prepare
from baton.hashing import sha256_file
from support.helpers import read_metrics
from support.mixdata import write_mix_config

CAP = 1500


def test_mix_prepares_verifies_and_trains_across_an_epoch(tmp_path, mix_paths, baton_cli):
    caps = {"jsonl": CAP, "parquet": CAP, "texts": CAP}  # a corpus smaller than the horizon: two epochs
    cfg = write_mix_config(tmp_path / "mix.toml", tmp_path / "data", mix_paths, caps=caps)
    prep = baton_cli("prepare", "-c", str(cfg), "--no-progress", check=True)
    m = load_manifest(tmp_path / "data")
    assert prep.stdout.strip().endswith(f"fingerprint {m['fingerprint']}")
    assert [(s["kind"], s["tokens"]) for s in m["sources"]] == [("jsonl", CAP), ("parquet", CAP), ("text", CAP)]
    assert all(s["documents"] > 0 for s in m["sources"])
    assert m["total_tokens"] == 3 * CAP == sum(s["tokens"] for s in m["shards"])
    assert m["tokenizer"]["sha256"] == sha256_file(tmp_path / "data" / "tokenizer.json")
    assert m["mix"]["seed"] == 7 and m["n_shards"] == len(m["shards"])
    for s in m["shards"]:
        assert set(s) == {"file", "sha256", "tokens", "sources"}
        assert sha256_file(tmp_path / "data" / s["file"]) == s["sha256"]

    verify = baton_cli("verify-data", "-c", str(cfg), check=True)
    summary = f"verify-data: {m['n_shards'] + 1} files hashed, 4,500 tokens, 0 mismatches"
    assert verify.stdout.strip().startswith(summary)

    info = baton_cli("data-info", "-c", str(cfg), check=True).stdout
    assert "4,500 tokens → 140 windows of 32 (124 train, 16 validation)" in info
    assert "horizon 20 × 256 = 5,120 tokens; -22.5 % margin" in info
    assert "1.29 passes" in info and "validation: " in info

    baton_cli("train", "-c", str(cfg), "--no-progress", check=True)
    rows = read_metrics(tmp_path / "runs" / "mix")
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert rows[-1]["samples_consumed"] == 160 > 124  # it read on into the second epoch
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"]


def test_fingerprint_is_the_content_same_inputs_same_print_one_changed_document_changes_it(tmp_path, mix_paths,
                                                                                          mix_prepared):
    first = load_manifest(mix_prepared[1])
    # Prepared again from scratch (tokenizer training included) into another folder: the same bytes.
    again = prepare(load_config(write_mix_config(tmp_path / "a.toml", tmp_path / "a", mix_paths,
                                                 data={"shard_tokens": 8000})), progress=False)
    assert again["fingerprint"] == first["fingerprint"]
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]

    # The same documents copied elsewhere, with the first prepare's tokenizer: still the same print.
    moved = {k: tmp_path / "moved" / p.name for k, p in mix_paths.items()}
    (tmp_path / "moved").mkdir()
    for k, p in mix_paths.items():
        (shutil.copytree if p.is_dir() else shutil.copyfile)(p, moved[k])
    tok = {"shard_tokens": 8000, "tokenizer": str(mix_prepared[1] / "tokenizer.json")}
    same = prepare(load_config(write_mix_config(tmp_path / "b.toml", tmp_path / "b", moved, data=tok)), progress=False)
    assert same["fingerprint"] == first["fingerprint"]

    # One word of one JSONL document changed: a different print.
    lines = moved["jsonl"].read_text().splitlines()
    doc = json.loads(lines[17])
    doc["text"] = doc["text"].replace("return", "yield", 1)
    assert doc["text"] != json.loads(lines[17])["text"]
    lines[17] = json.dumps(doc)
    moved["jsonl"].write_text("\n".join(lines) + "\n")
    changed_cfg = write_mix_config(tmp_path / "c.toml", tmp_path / "c", moved, data=tok)
    changed = prepare(load_config(changed_cfg), progress=False)
    assert changed["fingerprint"] != first["fingerprint"]
    # Preparing into the folder of the unchanged copy notices the edit (the source files are part of the spec).
    redo = prepare(load_config(tmp_path / "b.toml"), progress=False)
    assert redo["fingerprint"] == changed["fingerprint"]
