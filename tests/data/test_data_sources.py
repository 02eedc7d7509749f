"""Sources and the mix: every kind reads the same documents, resumes from any position, and mixes by weight."""

from __future__ import annotations

import bz2
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


def _docs(src: SourceConfig) -> list[str]:
    reader = SourceReader(src, 0)
    return [d for d, _, _ in reader.read(reader.start())]


def test_text_files_are_utf8_or_refused_by_name(tmp_path):
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfbom text\r\n")
    assert _docs(SourceConfig(kind="text", path=str(tmp_path / "bom.txt"))) == ["bom text\r\n"]  # the mark dropped
    cases = {"latin.txt": ("café".encode("latin-1"), r"latin.txt is not UTF-8 text: byte 0xe9 at offset 3; convert"),
             "u16.txt": ("hello".encode("utf-16"), r"u16.txt is not UTF-8 text: byte 0xff at offset 0 \(it starts like "
                                                   r"UTF-16\)"),
             "a.txt.bz2": (bz2.compress(b"x" * 100), r"a.txt.bz2 is bzip2-compressed, which baton does not read")}
    for name, (raw, message) in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(DataError, match=message):
            _docs(SourceConfig(kind="text", path=str(tmp_path / name)))


def test_record_fields_that_are_not_text_are_refused_not_printed_as_python(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for value, kind in ((["a", "b"], "list"), ({"x": 1}, "dict"), (42, "int"), (True, "bool")):
        (tmp_path / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": value}) + "\n")
        with pytest.raises(DataError, match=rf"a.jsonl:2: field 'text' holds a {kind}, not text; point field at"):
            _docs(SourceConfig(kind="jsonl", path=str(tmp_path / "a.jsonl")))
    # A binary column of UTF-8 is text (decoded); bytes that are not UTF-8 are named by row.
    pq.write_table(pa.table({"bin": [b"ab", None, "é".encode()]}), tmp_path / "b.parquet")
    assert _docs(SourceConfig(kind="parquet", path=str(tmp_path / "b.parquet"), field="bin")) == ["ab", "é"]
    pq.write_table(pa.table({"bin": [b"ab", b"\xff"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c.parquet row 1: field 'bin' holds bytes that are not UTF-8 text"):
        _docs(SourceConfig(kind="parquet", path=str(tmp_path / "c.parquet"), field="bin"))


def test_a_lone_surrogate_in_jsonl_is_replaced_and_said_once(tmp_path, caplog):
    (tmp_path / "s.jsonl").write_text('{"text": "good doc"}\n{"text": "half \\ud83d here"}\n'
                                      '{"text": "whole \\ud83d\\ude00 pair"}\n{"text": "\\udc00 again"}\n')
    with caplog.at_level("WARNING"):
        docs = _docs(SourceConfig(kind="jsonl", path=str(tmp_path / "s.jsonl")))
    assert docs == ["good doc", "half \ufffd here", "whole \U0001f600 pair", "\ufffd again"]
    assert [r.getMessage() for r in caplog.records if "surrogate" in r.getMessage()] == [
        f"{tmp_path / 's.jsonl'}:2: a lone UTF-16 surrogate (half of a character) replaced by U+FFFD; later ones in "
        "this file are replaced too"]


def test_compressed_jsonl_baton_cannot_read_is_named(tmp_path):
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "a.jsonl.bz2").write_bytes(bz2.compress(b'{"text": "x"}\n'))
    with pytest.raises(DataError, match=r"matches no files \(it holds \.bz2 files, a compression baton does not read"):
        SourceReader(SourceConfig(kind="jsonl", path=str(tmp_path / "z")), 0)
    with pytest.raises(DataError, match=r"a.jsonl.bz2 is bzip2-compressed, which baton does not read"):
        _docs(SourceConfig(kind="jsonl", path=str(tmp_path / "z" / "*.jsonl.bz2")))


def test_each_file_is_read_once_whatever_the_links_that_reach_it(tmp_path):
    s = tmp_path / "s"
    (s / "sub").mkdir(parents=True)
    (s / "sub" / "a.txt").write_text("doc a")
    (s / "sub" / "loop").symlink_to("..")  # a loop: s/sub/loop/sub/loop/... reaches a.txt without end
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "b.txt").write_text("doc b")
    (s / "linked").symlink_to(tmp_path / "t")
    (s / "b-again.txt").symlink_to(tmp_path / "t" / "b.txt")
    docs = _docs(SourceConfig(kind="text", path=str(s / "**" / "*.txt")))
    assert sorted(docs) == ["doc a", "doc b"]
    assert sorted(_docs(SourceConfig(kind="text", path=str(s)))) == ["doc a", "doc b"]


def test_a_saved_dataset_without_a_train_split_reads_its_first_saved_split(tmp_path, caplog):
    import datasets

    datasets.DatasetDict({"validation": datasets.Dataset.from_dict({"text": ["v1", "v2"]}),
                          "test": datasets.Dataset.from_dict({"text": ["t1"]})}).save_to_disk(str(tmp_path / "hf"))
    with caplog.at_level("INFO"):
        assert _docs(SourceConfig(kind="hf_dataset", path=str(tmp_path / "hf"))) == ["v1", "v2"]
    assert any("no train split: reading 'validation', the first saved" in r.getMessage() for r in caplog.records)


def test_the_data_folder_inside_a_source_folder_is_never_read_as_documents(tmp_path, mix_prepared):
    """A text source over a folder that also holds data.dir: the second prepare reads the new document, not its own
    shards, manifest, tokenizer or journal, and prepares what the documents alone prepare."""
    _, clean_dir = mix_prepared

    def config(source: Path, data_dir: Path):
        (tmp_path / "c.toml").write_text(f'[[data.sources]]\nkind = "text"\npath = "{source}"\n')
        return load_config(tmp_path / "c.toml", [
            f"data.dir={data_dir}", f"data.tokenizer={clean_dir / 'tokenizer.json'}", "data.shard_tokens=1000",
            f"run.local_dir={tmp_path / 'runs'}", f"store.url={tmp_path / 'store'}", "data.val_windows=2"])

    src = tmp_path / "corpus"
    src.mkdir()
    for i, d in enumerate(DOCS[:6]):
        (src / f"d{i}.txt").write_text(d)
    first = prepare(config(src, src / "prepared"), progress=False)
    (src / "d9.txt").write_text(DOCS[7])
    second = prepare(config(src, src / "prepared"), progress=False)
    alone = tmp_path / "alone"
    alone.mkdir()
    for f in src.glob("*.txt"):
        (alone / f.name).write_bytes(f.read_bytes())
    expected = prepare(config(alone, tmp_path / "p2"), progress=False)
    assert second["total_tokens"] == expected["total_tokens"] > first["total_tokens"]
    assert [s["sha256"] for s in second["shards"]] == [s["sha256"] for s in expected["shards"]]
    assert [s["files"] for s in second["sources"]] == [7]


def test_a_shard_size_beyond_what_prepare_can_hold_is_a_config_error():
    from baton.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.shard_tokens"):
        load_config(None, ["data.shard_tokens=1000000000000"])
