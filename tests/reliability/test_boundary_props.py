"""Property-based boundary tests: damaged copies of every kind of file baton reads (truncated, bytes
flipped, spliced, replaced by noise) and invalid values for every config key and number flag. Whatever
hypothesis makes, the command ends with exit 0 (the damage did not matter) or exit 2 with one
`baton: error:` line, never a traceback, and the store byte-for-byte as it was."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_boundary import JSONL

from baton.cli import UsageError, build_parser
from baton.config import Config, load_config
from baton.errors import ConfigError
from support.boundary import assert_input_error, run_in_process, tree_hash

FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def crash_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@st.composite
def damage(draw, original: bytes) -> bytes:
    """A damaged copy of ``original``: cut short, bytes flipped, a slice of noise spliced in, or all noise."""
    how = draw(st.sampled_from(["cut", "flip", "splice", "noise"]))
    n = len(original)
    if how == "cut":
        return original[: draw(st.integers(0, max(0, n - 1)))]
    if how == "noise":
        return draw(st.binary(max_size=256))
    data = bytearray(original)
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, n - 1))
            data[i] ^= draw(st.integers(1, 255))
        return bytes(data)
    i = draw(st.integers(0, n))
    return bytes(data[:i]) + draw(st.binary(min_size=1, max_size=64)) + bytes(data[i + draw(st.integers(0, 64)):])


def _check(o, store: Path, before: str) -> None:
    assert o.status in (0, 2), f"exit {o.status}\n{o.stderr[-3000:]}"
    if o.status == 2:
        assert_input_error(o)
    assert "Traceback" not in o.stderr + o.stdout
    assert tree_hash(store) == before


def _parquet_bytes() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"row {i} {i * 31 % 97}" for i in range(200)]}), buf)
    return buf.getvalue()


def _small_jsonl(work: Path) -> Path:
    (work / "small.jsonl").write_bytes(JSONL[:20000])
    return work / "small.jsonl"


def _source_config(base: Path, work: Path, kind: str, path: Path) -> str:
    text = (base / "cfg.toml").read_text()
    text = text[: text.index("[[data.sources]]")] + f'[[data.sources]]\nkind = "{kind}"\npath = "{path}"\n\n' + \
        text[text.index("[optim]"):]
    (work / "c.toml").write_text(text)
    return str(work / "c.toml")


# (kind, file inside the base, how to run the command that reads it)
DATA_FILES = {
    "toml-config": lambda b, w, f: ["config", "-c", str(f)],
    "bench-json": lambda b, w, f: ["plan", "--rate-from", str(f), "--steps", "10", "--tokens-per-step", "9",
                                   "--session-hours", "1"],
    "jsonl-gz-source": lambda b, w, f: ["prepare", "-c", _source_config(b, w, "jsonl", f), "--no-progress",
                                        "--set", f"data.dir={w / 'p'}"],
    "parquet-source": lambda b, w, f: ["prepare", "-c", _source_config(b, w, "parquet", f), "--no-progress",
                                       "--set", f"data.dir={w / 'p'}"],
    # A damaged tokenizer can still load; the prepare it then allows reads a small source.
    "data-tokenizer": lambda b, w, f: ["prepare", "-c", _source_config(b, w, "jsonl", _small_jsonl(w)),
                                       "--no-progress", "--set", f"data.dir={w / 'p'}", "--set", f"data.tokenizer={f}"],
}
ORIGINALS = {
    "toml-config": lambda b: (b / "cfg.toml").read_bytes(),
    "bench-json": lambda b: json.dumps({"cells": [{"label": "sdpa", "status": "ok", "tokens_per_s": 1000.0}],
                                        "picked": "sdpa", "ranks": 1}).encode(),
    "jsonl-gz-source": lambda b: __import__("gzip").compress(JSONL[:20000]),
    "parquet-source": lambda b: _parquet_bytes(),
    "data-tokenizer": lambda b: (b / "corpus" / "tokenizer.json").read_bytes(),
}
SUFFIX = {"toml-config": ".toml", "bench-json": ".json", "jsonl-gz-source": ".jsonl.gz", "parquet-source": ".parquet",
          "data-tokenizer": ".json"}


@pytest.mark.parametrize("kind", list(DATA_FILES))
def test_damaged_input_files(kind, base, capsys):
    original = ORIGINALS[kind](base)
    before = tree_hash(base / "store")

    @FEW
    @given(data=damage(original))
    def prop(data):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            f = work / f"file{SUFFIX[kind]}"
            f.write_bytes(data)
            _check(run_in_process(DATA_FILES[kind](base, work, f), capsys), base / "store", before)

    prop()


MODEL_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]


@pytest.mark.parametrize("name", MODEL_FILES)
def test_damaged_exported_model(name, base, exported, capsys):
    before = tree_hash(base / "store")

    def sample(model: Path, tmp: Path) -> None:
        o = run_in_process(["sample", "--from", str(model), "--max-new-tokens", "1"], capsys)
        _check(o, base / "store", before)

    _on_damaged_copies(exported, Path(name), sample)


STORE_FILES = ["latest.json", "state.json", "model.safetensors"]


@pytest.mark.parametrize("name", STORE_FILES)
def test_damaged_store_files_never_change_the_store(name, base, capsys):
    """A damaged pointer or checkpoint file in a copy of the store: export from it fails cleanly and writes
    nothing into it."""
    src = base / "store"
    pointer = json.loads((src / "test" / "latest.json").read_text())
    rel = Path("test") / ("latest.json" if name == "latest.json" else Path(pointer["path"]) / name)

    def export(store: Path, tmp: Path) -> None:
        before = tree_hash(store)
        o = run_in_process(["export", "-c", str(base / "cfg.toml"), "--set", f"store.url={store}",
                            "--out", str(tmp / "out")], capsys)
        _check(o, store, before)

    _on_damaged_copies(src, rel, export)


def _on_damaged_copies(src: Path, rel: Path, run_and_check) -> None:
    """For each generated damage of ``src / rel``: a fresh copy of ``src`` with that file damaged, handed with
    its scratch folder to ``run_and_check``."""
    @FEW
    @given(data=damage((src / rel).read_bytes()))
    def prop(data):
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "copy"
            shutil.copytree(src, copy)
            (copy / rel).write_bytes(data)
            run_and_check(copy, Path(tmp))

    prop()


# ----------------------------------------------------------------------------------- config keys


def _leaves() -> dict[str, type]:
    out = {}
    for section, cls in typing.get_type_hints(Config).items():
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if typing.get_origin(tp) is not list:
                out[f"{section}.{f.name}"] = tp
    return out


LEAVES = _leaves()
FLOAT_KEYS = sorted(k for k, tp in LEAVES.items() if tp is float)
bad_values = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "0", "-1", "-0.0", "1e400", "true", '""', "[]", "{}", str(2**70)]),
    st.integers(min_value=-(2**64), max_value=0).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda v: "nan" if math.isnan(v) else
                                                       ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)),
    st.text(max_size=12).map(json.dumps),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(LEAVES)), value=bad_values)
def test_invalid_config_values_one_line(key, value, capsys):
    o = run_in_process(["config", "--set", f"{key}={value}"], capsys)
    assert o.status in (0, 2), o.stderr
    assert "Traceback" not in o.stderr
    if o.status == 2:
        assert len(o.error_lines) == 1 and o.stderr.startswith("baton: error: invalid config")


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(FLOAT_KEYS), value=st.sampled_from(["nan", "inf", "-inf", "+inf", "1e999", "-1e999"]))
def test_every_float_key_refuses_non_finite(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    assert str(e.value).count("\n") == 0 and f"{key} must be a finite number" in str(e.value)


@settings(max_examples=60, deadline=None)
@given(name=st.one_of(st.text(max_size=130), st.text(alphabet="abc.-_/\\\0 é", max_size=8),
                      st.integers(90, 130).map(lambda n: "r" * n)))
def test_run_names_are_portable_file_names_or_refused(name):
    try:
        cfg = load_config(None, [f"run.name={json.dumps(name)}"])
    except ConfigError as e:
        assert "run.name=" in str(e) and str(e).count("\n") == 0
        return
    assert cfg.run.name == name and 1 <= len(name) <= 100
    with tempfile.TemporaryDirectory() as tmp:  # a name that passes is one folder on any file system
        (Path(tmp) / name).mkdir()
        assert [p.name for p in Path(tmp).iterdir()] == [name]


# ----------------------------------------------------------------------------------- number flags


def _number_flags() -> list[tuple[str, argparse.Action, list[str]]]:
    """(command, action, the command's required arguments) for every flag with a checked number type."""
    out = []
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for cmd, p in sub.choices.items():
        required = []
        for a in p._actions:
            if a.required and a.option_strings:
                required += [a.option_strings[0], "x"]
        for a in p._actions:
            if hasattr(a.type, "bounds"):
                out.append((cmd, a, required))
    return out


NUMBER_FLAGS = _number_flags()


def test_every_number_flag_is_checked():
    types = {(cmd, a.dest) for cmd, a, _ in NUMBER_FLAGS}
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    unchecked = [(cmd, a.dest) for cmd, p in sub.choices.items() for a in p._actions
                 if a.type in (int, float) and (cmd, a.dest) not in types]
    # --nproc, --stop-after-steps and --leg-steps keep their own check with its own message.
    assert set(unchecked) <= {("train", "stop_after_steps"), ("train", "nproc"), ("preflight", "leg_steps")}, unchecked
    assert len(NUMBER_FLAGS) >= 15


@settings(max_examples=120, deadline=None)
@given(flag=st.sampled_from(range(len(NUMBER_FLAGS))),
       text=st.one_of(st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e400", "", " ", "0x10", "1_0", str(2**80)]),
                      st.integers(-(2**70), 2**70).map(str), st.floats().map(repr), st.text(max_size=10)))
def test_number_flags_parse_in_range_or_refuse_in_one_line(flag, text):
    cmd, action, required = NUMBER_FLAGS[flag]
    try:
        args = build_parser().parse_args([cmd, *required, f"{action.option_strings[-1]}={text}"])
    except UsageError as e:
        assert "\n" not in str(e) and action.option_strings[-1] in str(e)
        return
    v = getattr(args, action.dest)
    lo, hi, lo_open = action.type.bounds
    assert math.isfinite(v)
    assert lo is None or (v > lo if lo_open else v >= lo)
    assert hi is None or v <= hi
