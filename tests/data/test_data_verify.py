"""`baton verify-data`: every kind of damage is caught and named, in a folder and through the store protocol."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from baton.data.manifest import corpus_fingerprint, load_manifest
from baton.data.shards import HEADER_SIZE, open_shard, write_shard
from baton.data.verify import verify_data


def _location(folder: Path, how: str) -> str:
    return str(folder) if how == "path" else "file://" + str(folder)


@pytest.fixture
def copy(tmp_path, mix_prepared) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(mix_prepared[1], dst)
    return dst


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


def _edit_manifest(folder: Path, **changes) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    m.update(changes)
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


DAMAGE = {
    "flipped byte": lambda d, m: (_flip(d / m["shards"][1]["file"], HEADER_SIZE + 123), m["shards"][1]["file"]),
    "truncated shard": lambda d, m: (_truncate(d / m["shards"][2]["file"]), m["shards"][2]["file"]),
    "missing shard": lambda d, m: ((d / m["shards"][0]["file"]).unlink(), m["shards"][0]["file"]),
    "extra shard": lambda d, m: (shutil.copyfile(d / m["shards"][0]["file"], d / "shard-99999.bin"), "shard-99999.bin"),
    "total disagrees": lambda d, m: (_edit_manifest(d, total_tokens=m["total_tokens"] + 1), "manifest.json"),
    "count disagrees": lambda d, m: (_edit_manifest(d, n_shards=m["n_shards"] - 1), "manifest.json"),
    "tokenizer changed": lambda d, m: (_flip(d / "tokenizer.json", 40), "tokenizer.json"),
    "token outside the vocabulary": lambda d, m: (None, _foreign_token(d, m)),
}


def _foreign_token(folder: Path, m: dict) -> str:
    """Shard 1 rewritten with one token id the tokenizer does not have, its manifest record (sha256 and the
    fingerprint) updated to match: only the vocabulary check can catch it."""
    s = m["shards"][1]
    tokens = open_shard(folder / s["file"]).copy()
    tokens[57] = m["tokenizer"]["vocab_size"]
    s["sha256"] = write_shard(folder / s["file"], tokens)
    _edit_manifest(folder, shards=m["shards"],
                   fingerprint=corpus_fingerprint(m["shards"], m["tokenizer"]["sha256"], m["dtype"]))
    return s["file"]


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 7])


@pytest.mark.parametrize("how", ["path", "store"])
def test_clean_folder_passes(copy, how):
    report = verify_data(_location(copy, how))
    m = load_manifest(copy)
    assert report.ok, report.problems
    assert report.files_hashed == m["n_shards"] + 1  # every shard and the tokenizer
    assert report.total_tokens == m["total_tokens"]
    assert report.records == report.declared == report.found == m["n_shards"]


@pytest.mark.parametrize("how", ["path", "store"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_each_damage_is_caught_and_named(copy, how, damage):
    name = DAMAGE[damage](copy, load_manifest(copy))[1]
    report = verify_data(_location(copy, how))
    assert not report.ok
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(name + ":"), report.problems
    if damage == "token outside the vocabulary":
        vocab = load_manifest(copy)["tokenizer"]["vocab_size"]
        assert report.problems[0] == (f"{name}: holds token id {vocab}, outside the tokenizer's {vocab} tokens: the "
                                      "shards were not written with this tokenizer (rerun `baton prepare`)")


def test_cli_prints_one_summary_line_and_exits_nonzero_naming_each_bad_file(copy, baton_cli):
    m = load_manifest(copy)
    ok = baton_cli("verify-data", "--dir", str(copy))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().splitlines() == [
        f"verify-data: {m['n_shards'] + 1} files hashed, {m['total_tokens']:,} tokens, 0 mismatches "
        f"(shards: {m['n_shards']} records, {m['n_shards']} declared, {m['n_shards']} found)"]
    _flip(copy / m["shards"][1]["file"], HEADER_SIZE + 5)
    (copy / m["shards"][3]["file"]).unlink()
    bad = baton_cli("verify-data", "--dir", "file://" + str(copy))
    assert bad.returncode == 1
    lines = bad.stdout.strip().splitlines()
    assert lines[-1].startswith(f"verify-data: {m['n_shards']} files hashed, ") and " 2 mismatches" in lines[-1]
    named = sorted(line.split()[1].rstrip(":") for line in lines[:-1])
    assert named == sorted([m["shards"][1]["file"], m["shards"][3]["file"]])
    missing = baton_cli("verify-data", "--dir", str(copy / "nope"))
    assert missing.returncode == 2 and missing.stderr.startswith("baton: error: ")


# A manifest edited by hand into the wrong shape: every reader (verify-data, training's reader, the pull from
# a store) refuses it in one line naming the field, never an exception from deep inside it.
MALFORMED = {
    "shards not a list": lambda m: m.update(shards={"shard-00000.bin": 1}),
    "shards null": lambda m: m.update(shards=None),
    "shard record not a record": lambda m: m["shards"].__setitem__(0, "shard-00000.bin"),
    "tokens not a number": lambda m: m["shards"][0].update(tokens="many"),
    "negative tokens": lambda m: m["shards"][0].update(tokens=-5),
    "shard without file": lambda m: m["shards"][0].pop("file"),
    "total as text": lambda m: m.update(total_tokens=str(m["total_tokens"])),
    "n_shards as text": lambda m: m.update(n_shards=str(m["n_shards"])),
    "tokenizer as text": lambda m: m.update(tokenizer="tokenizer.json"),
    "tokenizer outside": lambda m: m["tokenizer"].update(file="../tokenizer.json"),
    "tokenizer absolute": lambda m: m["tokenizer"].update(file="/etc/hostname"),
    "tokenizer is a shard": lambda m: m["tokenizer"].update(file=m["shards"][0]["file"]),
    "dtype unknown": lambda m: m.update(dtype="float64"),
    "sources not a list": lambda m: m.update(sources=5),
    "decontamination as text": lambda m: m.update(decontamination="x"),
    "decontamination without counts": lambda m: m.update(decontamination={"ngram": 13}),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_manifest_is_one_error_for_every_reader(case, tmp_path, prepared_data):
    from baton.config import load_config
    from baton.data.pull import ensure_data
    from baton.data.reader import WindowDataset
    from baton.errors import DataError

    folder = tmp_path / "published"
    shutil.copytree(prepared_data, folder)
    m = json.loads((folder / "manifest.json").read_text())
    MALFORMED[case](m)
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="manifest.json.* is malformed.*rerun `baton prepare`"):
        verify_data(str(folder))
    with pytest.raises(DataError, match="manifest.json is malformed"):
        WindowDataset(folder, 32, 7, 16)
    cfg = load_config(None, [f"data.dir={tmp_path / 'fresh'}", f"data.url=file://{folder}",
                             f"store.url={tmp_path / 'store'}", f"run.local_dir={tmp_path / 'runs'}"])
    with pytest.raises(DataError, match="manifest.json in .* is malformed.*baton publish-data"):
        ensure_data(cfg)
    assert not (tmp_path / "fresh").exists() and not (tmp_path.parent / "tokenizer.json").exists()


# Edits that keep the manifest's shape but not its word: the shard list no longer what the fingerprint (and so
# every resume's identity check) names. Every reader refuses them before a single shard is read.
DISAGREEING = {
    "two shards swapped": lambda m: m["shards"].__setitem__(slice(0, 2), m["shards"][1::-1]),
    "a shard duplicated": lambda m: (m["shards"].append(dict(m["shards"][0])),
                                     m.update(n_shards=m["n_shards"] + 1,
                                              total_tokens=m["total_tokens"] + m["shards"][0]["tokens"])),
    "a shard outside the folder": lambda m: m["shards"][0].update(file="../data/" + m["shards"][0]["file"]),
}


@pytest.mark.parametrize("case", list(DISAGREEING))
def test_a_manifest_that_disagrees_with_itself_is_refused_by_the_reader_and_prepare_redoes_it(case, tmp_path,
                                                                                            mix_prepared):
    from baton.config import load_config
    from baton.data.prepare import prepare
    from baton.data.reader import WindowDataset
    from baton.errors import DataError

    cfg_path, prepared = mix_prepared
    folder = tmp_path / "data"
    shutil.copytree(prepared, folder)
    original = load_manifest(folder)
    m = json.loads((folder / "manifest.json").read_text())
    DISAGREEING[case](m)
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"manifest.json does not agree with itself \(manifest.json: .*\); it was "
                                        r"edited or damaged after it was written: rerun `baton prepare`"):
        WindowDataset(folder, 32, 7, 16)
    assert not verify_data(str(folder)).ok
    # prepare does not take the folder for prepared: it writes it again, equal to the original.
    again = prepare(load_config(cfg_path, [f"data.dir={folder}"]), progress=False)
    assert again["fingerprint"] == original["fingerprint"] and again["shards"] == original["shards"]


def test_a_shard_record_naming_a_folder_is_one_line(tmp_path, prepared_data):
    from baton.data.reader import WindowDataset
    from baton.errors import DataError

    folder = tmp_path / "data"
    shutil.copytree(prepared_data, folder)
    name = load_manifest(folder)["shards"][0]["file"]
    (folder / name).unlink()
    (folder / name).mkdir()
    with pytest.raises(DataError, match=rf"shard {folder / name} could not be read \(Is a directory\); rerun"):
        WindowDataset(folder, 32, 7, 16)


def test_the_tokenizer_record_must_say_what_the_tokenizer_file_holds(copy, baton_cli):
    m = load_manifest(copy)
    tok = m["tokenizer"]
    _edit_manifest(copy, tokenizer={**tok, "vocab_size": tok["vocab_size"] + 88})
    report = verify_data(str(copy))
    assert report.problems == [f"tokenizer.json: the manifest records vocab_size {tok['vocab_size'] + 88} (the file's: "
                               f"{tok['vocab_size']}): it was edited after prepare (rerun `baton prepare`)"]
    # Values from the manifest reach the terminal escaped (a record's text may hold control characters).
    _edit_manifest(copy, tokenizer=tok)
    shard = m["shards"][0]
    shard["sha256"] = "\x1b[31mred" + shard["sha256"][10:]
    _edit_manifest(copy, shards=m["shards"], fingerprint=corpus_fingerprint(m["shards"], tok["sha256"], m["dtype"]))
    out = baton_cli("verify-data", "--dir", str(copy))
    assert out.returncode == 1 and "\x1b" not in out.stdout and "\\x1b[31mred" in out.stdout, out.stdout
