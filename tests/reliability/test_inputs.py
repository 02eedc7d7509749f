"""Inputs typed at the door: every path and URL a config key, a flag or an API argument carries goes through
one path type, one URL split and one place rule, and every command checks all its targets before any work.

Whatever string hypothesis makes for a path or URL key or flag, and whatever wrong type for an API argument,
the outcome is exit 0 (the value was fine) or one `baton: error:` line with no raw control character (exit 2,
a BatonError in Python), and a refusal leaves the store, the run folder and the data folder byte-identical.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
from pathlib import Path, PurePath

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import baton
from baton.config import Config, config_from_dict, load_config
from baton.errors import BatonError
from baton.guard import PATH_KEYS, URL_KEYS, check_layout
from baton.runtime.launch import LaunchSpec
from support.boundary import assert_input_error, run_in_process, tree_hash
from support.helpers import write_config

FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])

# Strings a person (or a script) may pass for a path or a URL: anything, and the kinds that broke once.
ANY_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(max_codepoint=0x20), max_size=6).map(lambda s: f"a{s}b"),  # controls, NUL
    st.integers(250, 5000).map(lambda n: "n" * n),  # a name or a path longer than the file system takes
    st.integers(1, 40).map(lambda n: "/".join(["d" * 200] * n)),
    st.sampled_from(["", ".", "..", "/", "~", "~nobody-here/x", "/proc/baton-nope", "/dev/null", "file://rel/x",
                     "file:///", "http://[::1", "s3://b/p?endpoint=http://[x", "s3://b/p?endpoint=http://h:port",
                     "hf://o/r?revision=../x", "ftp://h/x", "a\x1b[31mred", "tab\there", "x\udcffy", "\x7f"]),
)


def _one_line_escaped(message: str) -> None:
    assert "\n" not in message and all(c.isprintable() for c in message), repr(message)


@pytest.fixture(autouse=True)
def crash_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def world(base, tmp_path, monkeypatch):
    """A copy of the base run (store with a verified checkpoint at step 2, run folder, data) that commands
    may write into when a value turns out valid; the working folder is an empty scratch folder."""
    w = tmp_path / "w"
    for name in ("store", "runs", "corpus"):
        shutil.copytree(base / name, w / name)
    cfg = write_config(w / "cfg.toml", data_dir=w / "corpus", store=w / "store", runs=w / "runs")
    (w / "cwd").mkdir()
    monkeypatch.chdir(w / "cwd")
    return w, str(cfg)


def _snapshot(w: Path) -> tuple[str, str, str]:
    return tree_hash(w / "store"), tree_hash(w / "runs"), tree_hash(w / "corpus")


# ----------------------------------------------------------------------------------- config keys


def _raw(key: str, value: str) -> dict:
    if key == "data.sources[].path":
        return {"data": {"sources": [{"kind": "text", "path": value}]}}
    section, name = key.split(".")
    return {section: {name: [value] if name in ("files", "decontaminate") else value}}


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from([*PATH_KEYS, *URL_KEYS, "data.sources[].path"]), value=ANY_TEXT)
def test_any_string_for_a_path_or_url_key_loads_or_is_one_escaped_line(key, value, tmp_path_factory):
    """In process: the config's own check, then the layout check every command makes (the folders it
    writes probed for a write), never another exception."""
    assume(not (key in ("store.url",) and value == ""))  # empty store.url: its own message
    try:
        cfg = config_from_dict(_raw(key, value))
        check_layout(cfg, ("store.url", "run.local_dir", "data.dir"))
    except BatonError as e:
        _one_line_escaped(str(e))


def test_path_and_url_values_are_named_with_the_rule_they_break():
    cases = {
        "data.dir": ("a\0b", "data.dir a\\x00b holds a NUL byte"),
        "run.local_dir": ("r\x1b[31m", "run.local_dir r\\x1b[31m holds a control character"),
        "store.url": ("s" * 300, "has a name of 300 bytes; the file system takes at most 255"),
        "publish.url": ("http://[::1", "publish.url http://[::1 is not a valid URL (Invalid IPv6 URL; check its "
                                       "brackets and its port)"),
        "data.url": ("s3://b/p?endpoint=http://h:port", "data.url's endpoint http://h:port is not a valid URL"),
    }
    for key, (value, expect) in cases.items():
        with pytest.raises(BatonError) as e:
            load_config(None, [f"{key}={json.dumps(value)}"])
        assert expect in str(e.value), str(e.value)
        _one_line_escaped(str(e.value))


# ----------------------------------------------------------------------------------- path flags


def _flag_argv(flag: str, value: str, cfg: str, w: Path) -> list[str]:
    full = w / "full"
    full.mkdir(exist_ok=True)
    (full / "kept.txt").write_text("kept")
    return {
        "config --config": ["config", "--config", value],
        "export --out": ["export", "-c", cfg, "--out", value],
        "export --from": ["export", "-c", cfg, "--from", value, "--out", str(w / "exported")],
        "report --out": ["report", "-c", cfg, "--out", value],
        "plan --rate-from": ["plan", "--rate-from", value, "--steps", "10", "--tokens-per-step", "9",
                             "--session-hours", "1"],
        "sample --from": ["sample", "--from", value],
        "verify-data --dir": ["verify-data", "--dir", value],
        "preflight --store": ["preflight", "-c", cfg, "--store", value, "--out", str(full)],
        "eval --files": ["eval", "-c", cfg, "--files", value],
        "publish --revision": ["publish", "-c", cfg, "--set", f"publish.url={w / 'published'}", "--revision", value],
    }[flag]


FLAGS = ["config --config", "export --out", "export --from", "report --out", "plan --rate-from", "sample --from",
         "verify-data --dir", "preflight --store", "eval --files", "publish --revision"]


@pytest.mark.parametrize("flag", FLAGS)
def test_any_string_for_a_path_flag_is_taken_or_refused_in_one_line_with_nothing_changed(flag, world, capsys):
    w, cfg = world

    @FEW
    @given(value=ANY_TEXT.filter(lambda v: not v.startswith("-")))  # argparse reads "-x" as a flag
    @example(value="\xad")  # a format character (a soft hyphen), not printable: once printed raw
    def prop(value):
        before = _snapshot(w)
        o = run_in_process(_flag_argv(flag, value, cfg, w), capsys)
        assert o.status in (0, 1, 2) and "Traceback" not in o.stderr + o.stdout, o.stderr[-3000:]
        if o.status == 1:  # verify-data's "mismatch" exit, or a preflight that ran and failed: never a bug
            assert "internal error" not in o.stderr, o.stderr[-3000:]
        if o.status == 2:
            _one_line_escaped(assert_input_error(o))
            assert _snapshot(w) == before, f"{flag} {value!r} changed a place before refusing"

    prop()


# ----------------------------------------------------------------------------------- order of checks


def test_publish_and_eval_refuse_before_any_work(world, capsys):
    """A bad revision, a target that is a file or cannot be written, a target inside the data, run or store
    folder, an eval file that is a folder: refused before the pull, the export, the evaluation and the
    evaluation record; the store, the run folder and the data folder byte-identical."""
    w, cfg = world
    (w / "a-file").write_text("not a folder")
    pub = ["publish", "-c", cfg, "--set"]
    cases = [
        ([*pub, f"publish.url={w / 'out'}", "--revision", "../x"], "--revision ../x must be a relative name"),
        ([*pub, f"publish.url={w / 'out'}", "--revision", "/abs"], "--revision /abs must be a relative name"),
        ([*pub, f"publish.url={w / 'a-file'}"], "is a file, not a folder"),
        ([*pub, f"publish.url={w / 'a-file' / 'sub'}"], "is a file, not a folder"),
        ([*pub, "publish.url=/proc/baton-nope"], "publish.url /proc/baton-nope cannot be written"),
        ([*pub, f"publish.url={w / 'corpus'}"], "publish.url " + str(w / "corpus") + " is inside the data folder"),
        ([*pub, f"publish.url={w / 'corpus' / 'model'}"], "is inside the data folder"),
        ([*pub, f"publish.url={w / 'runs' / 'test' / 'model'}"], "is inside the run folder"),
        ([*pub, f"publish.url={w / 'store' / 'model'}"], "is inside the store's folder"),
        ([*pub, f"publish.url={w}"], "holds the store's folder"),
        (["publish-data", "-c", cfg, "--set", f"data.url={w / 'corpus' / 'copy'}"], "is inside the data folder"),
        (["publish-data", "-c", cfg, "--set", f"data.url={w / 'runs' / 'test'}"], "is inside the run folder"),
        (["train", "-c", cfg, "--no-progress", "--set", f"publish.url={w / 'a-file'}"],
         f"publish.url {w / 'a-file'} is a file, not a folder"),  # said now, not at the horizon's publish
        (["train", "-c", cfg, "--no-progress", "--set", "publish.url=/proc/baton-nope"],
         "publish.url /proc/baton-nope cannot be written"),
        (["publish-data", "-c", cfg, "--set", f"data.url={w / 'a-file'}"], "is a file, not a folder"),
        (["eval", "-c", cfg, "--files", str(w / "corpus")], "is a folder, not a file"),
        (["eval", "-c", cfg, "--files", "a\x00b"], "eval file a\\x00b holds a NUL byte"),
    ]
    for argv, expect in cases:
        before = _snapshot(w)
        line = assert_input_error(run_in_process(argv, capsys), expect)
        _one_line_escaped(line)
        assert _snapshot(w) == before, argv
        assert not (w / "out").exists() and not (w / "store" / "test" / "eval").exists(), argv


# ----------------------------------------------------------------------------------- the Python API


PUBLIC = ["load_config", "prepare", "publish_data", "train", "status", "plan", "simulate", "export", "eval",
          "publish"]


def _accepts(annotation: str, value: object) -> bool:
    """Whether an argument annotated ``annotation`` (the source text) takes ``value``, read independently of
    the API's own check."""
    for part in re.split(r" \| (?![^\[]*\])", annotation):  # the top level's alternatives
        if part == "Any" or (part == "None" and value is None):
            return True
        items = re.fullmatch(r"Iterable\[(.+)\]", part)
        if items and (isinstance(value, (str, PurePath)) and _accepts(items.group(1), value) or isinstance(
                value, (list, tuple)) and all(
                _accepts(items.group(1), v) for v in value)):
            return True
        if part.startswith("Mapping[") and isinstance(value, dict):
            return True
        kinds = {"str": str, "Path": PurePath, "int": int, "float": (int, float), "bool": bool, "Config": Config,
                 "LaunchSpec": LaunchSpec}
        if part in kinds and isinstance(value, kinds[part]) and (part == "bool" or not isinstance(value, bool)):
            return True
    return False


WRONG = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.booleans(), st.none(), st.binary(max_size=3),
                  st.lists(st.integers(), max_size=2), st.dictionaries(st.integers(), st.integers(), max_size=1),
                  st.just(Path("x")), st.just(object()), st.text(max_size=5), st.just(["ok", 3]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fn=st.sampled_from(PUBLIC), data=st.data())
def test_every_api_argument_of_a_wrong_type_is_one_config_error_naming_it(fn, data, tmp_path):
    """Each call gets a valid config and one argument of a type its annotation does not take: refused before
    any work, in one line that names the function, the argument and what it takes."""
    func = getattr(baton, fn)
    params = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    param = data.draw(st.sampled_from(params))
    value = data.draw(WRONG)
    assume(not _accepts(param.annotation, value))
    cfg = load_config(None, [f"store.url={tmp_path / 'store'}", f"run.local_dir={tmp_path / 'runs'}",
                             f"data.dir={tmp_path / 'data'}"])
    args = {p.name: cfg for p in params if p.name == "cfg"}
    if fn == "export":
        args["out"] = str(tmp_path / "o")
    args[param.name] = value
    with pytest.raises(BatonError) as e:
        func(**args)
    assert str(e.value).startswith(f"baton.{fn}: {param.name} must be "), str(e.value)
    _one_line_escaped(str(e.value))
    assert sorted(os.listdir(tmp_path)) == [], "refused before any work"


def test_a_string_where_a_list_is_expected_is_one_item(world):
    w, cfg_path = world
    cfg = baton.load_config(cfg_path)
    with pytest.raises(BatonError, match=r"^eval file notes.txt not found \(fix eval.files or --files\)$"):
        baton.eval(cfg, files="notes.txt")  # not the files n, o, t, ...
    with pytest.raises(BatonError, match="model.hidden cannot change on resume"):
        baton.train(cfg, allow_change="model.hidden")
    assert baton.load_config(cfg_path, "optim.lr=0.01").optim.lr == 0.01


def test_a_config_changed_in_place_is_checked_again_by_every_function(world):
    w, cfg_path = world
    cfg = baton.load_config(cfg_path)
    cfg.train.steps = "20"
    for call in (lambda: baton.status(cfg), lambda: baton.eval(cfg), lambda: baton.publish(cfg),
                 lambda: baton.export(cfg, str(w / "o"))):
        with pytest.raises(BatonError, match=r"^invalid config: train.steps must be int, got str '20'$"):
            call()
    cfg = baton.load_config(cfg_path)
    cfg.store.url = w / "store"  # a Path where the config holds text
    with pytest.raises(BatonError, match="store.url must be str, got PosixPath"):
        baton.status(cfg)


@pytest.mark.parametrize("variable, url, key", [
    ("AWS_ENDPOINT_URL", "s3://bucket/p", "the S3 endpoint"), ("AWS_ENDPOINT_URL_S3", "s3://bucket/p", "the S3 endpoint"),
    ("HF_ENDPOINT", "hf://owner/repo", "the Hub endpoint (HF_ENDPOINT)"),
])
@pytest.mark.parametrize("endpoint", ["http://[::1", "http://[x]:99", "http://h:port"])
def test_an_endpoint_urllib_cannot_split_is_one_line(variable, url, key, endpoint, world, monkeypatch, capsys):
    w, cfg = world
    monkeypatch.setenv(variable, endpoint)
    before = _snapshot(w)
    line = assert_input_error(run_in_process(["status", "-c", cfg, "--set", f"store.url={url}"], capsys),
                              f"{key} {endpoint} is not a valid URL")
    _one_line_escaped(line)
    assert _snapshot(w) == before


def test_dangling_symlinks_and_overlong_names_are_one_line(world, capsys):
    w, cfg = world
    link = w / "link"
    link.symlink_to(w / "nowhere")
    cases = [
        (["export", "-c", cfg, "--out", str(link)], f"--out {link} is a symlink to {w / 'nowhere'}, which does not "
                                                    "exist"),
        (["prepare", "-c", cfg, "--no-progress", "--set", f"data.dir={link}"],
         f"the data folder {link} (data.dir) is a symlink to"),
        (["train", "-c", cfg, "--no-progress", "--set", f"run.local_dir={link}"],
         f"the run folder {link / 'test'} (run.local_dir) cannot be made: {link} is a dangling symlink"),
        (["export", "-c", cfg, "--out", "n" * 300], "has a name of 300 bytes; the file system takes at most 255"),
        (["plan", "--rate-from", "/x" * 2500, "--steps", "10", "--tokens-per-step", "9", "--session-hours", "1"], "is 5000 bytes long as a full path; the file system takes paths under"),
        (["config", "-c", "a\x1b[31m.toml"], "config file a\\x1b[31m.toml holds a control character"),
    ]
    for argv, expect in cases:
        before = _snapshot(w)
        _one_line_escaped(assert_input_error(run_in_process(argv, capsys), expect))
        assert _snapshot(w) == before, argv
