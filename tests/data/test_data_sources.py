"""Sources and the mix: every kind reads the same documents, resumes from any position, and mixes by weight."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from baton.config import SourceConfig, load_config
from baton.data.manifest import load_manifest
from baton.data.mix import Mix
from baton.data.prepare import prepare
from baton.data.reader import TokenStream
from baton.data.sources import SourceReader
from baton.errors import DataError
from support.mixdata import stdlib_documents, write_mix_config

DOCS = stdlib_documents(120, 40)
assert len(DOCS) == 40


def _write_kinds(root: Path) -> dict[str, SourceConfig]:
    """The same documents as JSONL, gzipped JSONL, Parquet, a text folder and a `datasets` folder."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    lines = "".join(json.dumps({"text": d, "n": i}) + "\n" + ("\n" if i % 7 == 0 else "") for i, d in enumerate(DOCS))
    (root / "d.jsonl").write_text(lines)
    with gzip.open(root / "d.jsonl.gz", "wt") as f:
        f.write(lines)
    pq.write_table(pa.table({"body": DOCS}), root / "d.parquet", row_group_size=7)
    (root / "txt").mkdir()
    for i, d in enumerate(DOCS):
        (root / "txt" / f"{i:03d}.txt").write_text(d)
    (root / "txt" / ".hidden").write_text("not a document")
    datasets.Dataset.from_dict({"content": DOCS}).save_to_disk(str(root / "hf"))
    return {
        "jsonl": SourceConfig(kind="jsonl", path=str(root / "d.jsonl")),
        "jsonl.gz": SourceConfig(kind="jsonl", path=str(root / "d.jsonl.gz")),
        "parquet": SourceConfig(kind="parquet", path=str(root / "d.parquet"), field="body"),
        "text": SourceConfig(kind="text", path=str(root / "txt")),
        "hf_dataset": SourceConfig(kind="hf_dataset", path=str(root / "hf"), field="content"),
    }


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    return _write_kinds(tmp_path_factory.mktemp("kinds") / "src")


def test_every_kind_reads_the_same_documents_and_resumes_from_any_position(kinds):
    for name, src in kinds.items():
        reader = SourceReader(src, 0)
        full = list(reader.read(reader.start()))
        assert [d for d, _, _ in full] == DOCS, name
        for k in range(0, len(full), 3):  # restart right after document k: the rest, nothing else
            assert [d for d, _, _ in reader.read(full[k][2])] == DOCS[k + 1 :], (name, k)
        assert reader.est_bytes > 0 and reader.identity()


def test_every_kind_prepares_to_the_same_bytes(tmp_path, kinds, mix_prepared):
    tokenizer = mix_prepared[1] / "tokenizer.json"
    fingerprints = {}
    for name, src in kinds.items():
        cfg = load_config(mix_prepared[0], [f"data.dir={json.dumps(str(tmp_path / name))}",
                                            f"data.tokenizer={json.dumps(str(tokenizer))}"])
        cfg.data.sources = [src]
        fingerprints[name] = prepare(cfg, progress=False)["fingerprint"]
    assert len(set(fingerprints.values())) == 1, fingerprints


def test_weights_caps_and_interleaving(tmp_path, mix_paths, mix_prepared):
    tok = str(mix_prepared[1] / "tokenizer.json")
    one = load_manifest(mix_prepared[1])["sources"]
    cfg = write_mix_config(tmp_path / "w.toml", tmp_path / "w", mix_paths,
                           data={"tokenizer": tok, "shard_tokens": 4000},
                           weights={"jsonl": 2.0, "parquet": 0.5}, caps={"texts": 5000})
    m = prepare(load_config(cfg), progress=False)
    s = {x["kind"]: x for x in m["sources"]}
    assert s["jsonl"]["tokens"] == 2 * one[0]["tokens"] and s["jsonl"]["documents"] == 2 * one[0]["documents"]
    assert 0.3 < s["parquet"]["documents"] / one[1]["documents"] < 0.7  # a seeded half
    assert s["text"]["tokens"] == 5000
    assert m["total_tokens"] == sum(x["tokens"] for x in m["sources"])
    # Interleaved, not concatenated: the sources start together. With plain weights they also end together,
    # so the held-out windows at the end of the stream come from the mix, not from its last source.
    assert m["shards"][0]["sources"] == [0, 1, 2]
    plain = load_manifest(mix_prepared[1])["shards"]
    assert all(len(s["sources"]) >= 2 for s in plain) and plain[0]["sources"] == [0, 1, 2]
    # Documents are separated by the end-of-text token: one per kept document (the capped source's last is cut).
    eos = m["tokenizer"]["eos_id"]
    stream = TokenStream(tmp_path / "w", m)
    n_eos = sum(int((stream.shards[i] == eos).sum()) for i in range(len(stream.shards)))
    assert n_eos in (sum(x["documents"] for x in m["sources"]), sum(x["documents"] for x in m["sources"]) - 1)
    again = prepare(load_config(cfg, ["data.dir=" + json.dumps(str(tmp_path / "w2"))]), progress=False)
    assert again["fingerprint"] == m["fingerprint"]


def test_mix_state_round_trips_through_json(mix_paths):
    readers = [SourceReader(SourceConfig(kind="jsonl", path=str(mix_paths["jsonl"]), weight=1.5), 0),
               SourceReader(SourceConfig(kind="parquet", path=str(mix_paths["parquet"]), field="body"), 1),
               SourceReader(SourceConfig(kind="text", path=str(mix_paths["texts"]), max_bytes=20000), 2)]
    mix = Mix(readers, seed=3)
    drawn, states = [], []
    while True:
        states.append(json.loads(json.dumps(mix.snapshot())))
        item = mix.draw()
        if item is None:
            break
        drawn.append(item[:2])
    assert {si for si, _ in drawn} == {0, 1, 2}
    for k in (0, 1, 17, len(drawn) // 2, len(drawn) - 1):
        again = Mix(readers, seed=3, state=states[k])
        assert [again.draw()[:2] for _ in range(len(drawn) - k)] == drawn[k:]
        assert again.draw() is None


def test_source_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 has no field 'text'"):
        list(SourceReader(SourceConfig(kind="jsonl", path=str(bad)), 0).read([0, 0, 1]))
    bad.write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 is not valid JSON"):
        list(SourceReader(SourceConfig(kind="jsonl", path=str(bad)), 0).read([0, 0, 1]))
    with pytest.raises(DataError, match="matches no files"):
        SourceReader(SourceConfig(kind="text", path=str(tmp_path / "nothing-*.txt")), 0)
