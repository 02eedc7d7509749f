"""`baton verify-data`: every kind of damage is caught and named, in a folder and through the store protocol."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from baton.data.manifest import load_manifest
from baton.data.shards import HEADER_SIZE
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
}


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
