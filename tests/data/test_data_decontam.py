"""Decontamination drops exactly the training documents that share a long n-gram with an evaluation text."""

from __future__ import annotations

import json

import numpy as np

from baton.config import load_config
from baton.data.decontam import Decontaminator
from baton.data.manifest import load_manifest
from baton.data.prepare import prepare
from baton.data.sources import SourceReader
from baton.data.tokenize import load_tokenizer
from support.mixdata import write_mix_config

N = 13


def _ngrams(ids: list[int]) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + N]) for i in range(len(ids) - N + 1)}


def test_decontamination_drops_documents_sharing_an_ngram_and_reports_the_count(tmp_path, mix_paths, mix_prepared,
                                                                               baton_cli):
    cfg0, clean_dir = mix_prepared
    clean = load_manifest(clean_dir)
    tok = load_tokenizer(clean_dir / "tokenizer.json")
    docs = [json.loads(line)["text"] for line in mix_paths["jsonl"].read_text().splitlines()]
    # An evaluation set quoting the middle of two training documents, and some text of its own.
    passages = [docs[5][len(docs[5]) // 3 :][:240], docs[40][len(docs[40]) // 2 :][:240]]
    evals = [tmp_path / "eval-a.txt", tmp_path / "eval-b.txt"]
    evals[0].write_text("Question: what does this do?\n" + passages[0] + "\nAnswer: it depends.\n")
    evals[1].write_text(passages[1])

    # The expectation, computed independently: plain Python sets of token 13-grams.
    eval_grams = set().union(*(_ngrams(tok.encode(f.read_text(), add_special_tokens=False).ids) for f in evals))
    expected = {"documents": 0, "tokens": 0}
    readers = [SourceReader(s, i) for i, s in enumerate(load_config(cfg0).data.sources)]
    for r in readers:
        for text, _, _ in r.read(r.start()):
            ids = tok.encode(text, add_special_tokens=False).ids
            if _ngrams(ids) & eval_grams:
                expected["documents"] += 1
                expected["tokens"] += len(ids) + 1
    assert expected["documents"] >= 2

    data = {"shard_tokens": 8000, "tokenizer": str(clean_dir / "tokenizer.json"),
            "decontaminate": [str(evals[0]), str(tmp_path / "eval-b*.txt")]}
    cfg = write_mix_config(tmp_path / "d.toml", tmp_path / "d", mix_paths, data=data)
    m = prepare(load_config(cfg), progress=False)
    dc = m["decontamination"]
    assert (dc["dropped_documents"], dc["dropped_tokens"]) == (expected["documents"], expected["tokens"])
    assert dc["ngram"] == N and len(dc["texts"]) == 2
    assert m["total_tokens"] == clean["total_tokens"] - expected["tokens"]
    assert sum(s["dropped_documents"] for s in m["sources"]) == expected["documents"]
    info = baton_cli("data-info", "-c", str(cfg), check=True).stdout
    assert f"decontamination: {expected['documents']} documents ({expected['tokens']:,} tokens) dropped" in info


def test_hits_are_exact_never_hash_luck():
    rng = np.random.default_rng(0)
    evals = [rng.integers(0, 50, size=400), rng.integers(0, 50, size=30)]
    d = Decontaminator(evals, 5)
    grams = set().union(*(_ngrams_n(e.tolist(), 5) for e in evals))
    for _ in range(300):
        doc = rng.integers(0, 50, size=int(rng.integers(0, 60)))
        if rng.random() < 0.3:  # plant a shared 5-gram
            e = evals[int(rng.integers(0, 2))]
            at = int(rng.integers(0, len(e) - 5))
            doc = np.concatenate([doc, e[at : at + 5], doc[:3]])
        assert d.hit(doc) == bool(_ngrams_n(doc.tolist(), 5) & grams)


def _ngrams_n(ids: list[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


def test_evaluation_texts_shorter_than_the_ngram_are_said_and_all_short_is_refused(tmp_path, mix_paths, mix_prepared,
                                                                                  caplog):
    import pytest

    from baton.errors import DataError

    _, clean_dir = mix_prepared
    short, long = tmp_path / "q.txt", tmp_path / "passage.txt"
    short.write_text("Hamlet?")
    long.write_text(mix_paths["jsonl"].read_text().splitlines()[3][:400])
    data = {"shard_tokens": 8000, "tokenizer": str(clean_dir / "tokenizer.json"), "decontaminate": [str(short)]}
    cfg = write_mix_config(tmp_path / "d.toml", tmp_path / "d", mix_paths, data=data)
    with pytest.raises(DataError, match=r"every evaluation text is shorter than data.decontam_ngram=13 tokens \(.*"
                                        r"q.txt \(\d tokens\)\), so none could match a training document; lower"):
        prepare(load_config(cfg), progress=False)
    data["decontaminate"] = [str(short), str(long)]
    cfg = write_mix_config(tmp_path / "d.toml", tmp_path / "d", mix_paths, data=data)
    with caplog.at_level("WARNING"):
        m = prepare(load_config(cfg), progress=False)
    assert m["decontamination"]["eval_ngrams"] > 0
    assert any("1 of 2 evaluation texts are shorter than data.decontam_ngram=13 tokens" in r.getMessage()
               and "q.txt" in r.getMessage() for r in caplog.records)
