"""Bad input gets one clear line and exit status 2; every --help works."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from baton.cli import build_parser
from baton.config import load_config
from baton.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001


def _one_clear_line(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("baton: error:")]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_every_subcommand_help_exits_0(cmd, baton_cli):
    p = baton_cli(cmd, "--help")
    assert p.returncode == 0, p.stderr
    assert "usage: baton" in p.stdout


def test_top_level_help(baton_cli):
    p = baton_cli("--help")
    assert p.returncode == 0 and "prepare" in p.stdout and "train" in p.stdout


def _bad(tmp_path, text):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    return str(f)


def test_unknown_key(tmp_path, baton_cli):
    line = _one_clear_line(baton_cli("train", "-c", _bad(tmp_path, "[model]\nhiden = 64\n")), "'model.hiden'", "hidden")
    assert "valid keys" in line


def test_wrong_type(tmp_path, baton_cli):
    _one_clear_line(baton_cli("train", "-c", _bad(tmp_path, '[model]\nhidden = "big"\n')), "model.hidden must be int", "'big'")


def test_heads_not_dividing_hidden(tmp_path, baton_cli):
    _one_clear_line(baton_cli("train", "-c", _bad(tmp_path, "[model]\nhidden = 100\nn_heads = 3\nn_kv_heads = 1\n")),
                    "model.hidden=100 is not divisible by model.n_heads=3")


def test_kv_heads_not_dividing_heads(tmp_path, baton_cli):
    _one_clear_line(baton_cli("train", "-c", _bad(tmp_path, "[model]\nhidden = 96\nn_heads = 6\nn_kv_heads = 4\n")),
                    "n_heads=6 is not divisible by model.n_kv_heads=4")


def test_missing_data_folder(make_config, baton_cli, tmp_path):
    p = baton_cli("train", "-c", str(make_config()), "--set", f"data.dir={tmp_path / 'nowhere'}")
    _one_clear_line(p, "does not exist", "baton prepare")


def test_seq_len_longer_than_corpus(make_config, baton_cli):
    p = baton_cli("train", "-c", str(make_config()), "--set", "data.seq_len=10000000",
                  "--set", "model.max_seq_len=10000000")
    _one_clear_line(p, "data.seq_len=10000000 is too long for the corpus")


def test_set_on_missing_key(make_config, baton_cli):
    _one_clear_line(baton_cli("train", "-c", str(make_config()), "--set", "optim.learning_rate=1"),
                    "no such key 'learning_rate' in optim")


def test_set_without_equals(make_config, baton_cli):
    _one_clear_line(baton_cli("train", "-c", str(make_config()), "--set", "optim.lr"), "KEY=VALUE")


def test_missing_config_file(baton_cli, tmp_path):
    _one_clear_line(baton_cli("train", "-c", str(tmp_path / "absent.toml")), "not found")


def test_invalid_toml(tmp_path, baton_cli):
    _one_clear_line(baton_cli("prepare", "-c", _bad(tmp_path, "[model\n")), "not valid TOML")


def test_validation_lists_every_problem_at_once(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(_bad(tmp_path, "[model]\nhidden = 100\nn_heads = 3\n[train]\nprecision = 'fp8'\nmicro_batch = 3\n"
                                   "global_batch = 8\n[optim]\nlr = -1.0\n"))
    msg = str(e.value)
    for needle in ("hidden=100", "fp8", "global_batch=8 is not a multiple", "optim.lr must be > 0"):
        assert needle in msg
    assert msg.startswith("invalid config (")


def test_bool_is_not_an_int(tmp_path):
    with pytest.raises(ConfigError, match="train.steps must be int, got bool"):
        load_config(_bad(tmp_path, "[train]\nsteps = true\n"))


def test_store_retries_has_an_upper_bound():
    assert load_config(None, ["store.retries=100"]).store.retries == 100
    with pytest.raises(ConfigError, match=r"store.retries must be in \[1, 100\], got 1000000000$"):
        load_config(None, ["store.retries=1000000000"])


def test_store_retry_seconds_and_request_timeout_have_upper_bounds():
    cfg = load_config(None, ["store.retry_seconds=86400", "store.request_timeout=3600"])
    assert (cfg.store.retry_seconds, cfg.store.request_timeout) == (86400, 3600)
    with pytest.raises(ConfigError, match=r"store.retry_seconds must be in \(0, 86400\], got 10000000.0$"):
        load_config(None, ["store.retry_seconds=1e7"])
    with pytest.raises(ConfigError, match=r"store.request_timeout must be in \(0, 3600\], got 3601.0$"):
        load_config(None, ["store.request_timeout=3601"])


def test_overrides_are_typed(tmp_path):
    cfg = load_config(None, ["optim.lr=3e-4", "store.url=s3://bucket/runs", "model.grad_ckpt=true"])
    assert cfg.optim.lr == 3e-4 and cfg.store.url == "s3://bucket/runs" and cfg.model.grad_ckpt is True


def test_tiny_config_is_valid_and_counts_as_a_few_million():
    from baton.model.llama import param_count

    cfg = load_config("configs/tiny.toml")
    assert 1_000_000 < param_count(cfg.model) < 10_000_000


def test_verify_full_flag_reaches_the_run(make_config, baton_cli, tmp_path):
    import json

    baton_cli("train", "-c", str(make_config()), "--verify", "full", "--stop-after-steps", "2", "--no-progress",
              check=True)
    summary = json.loads((tmp_path / "runs" / "test" / "run_summary.json").read_text())
    assert summary["config"]["store"]["verify"] == "full"
    assert summary["checkpoints"][-1]["verified"]


def test_docs_reference_lists_every_config_key():
    from pathlib import Path

    from baton.config import reference_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for key, _, _, meaning in reference_table():
        assert f"| `{key}` |" in page, f"docs/configuration.md's reference lacks {key}"
        assert meaning, f"{key} has no help text in baton/config.py"


def test_docs_reference_is_the_generated_table(baton_cli):
    # docs/configuration.md's reference is `baton config --reference`'s output, row for row: regenerate it with
    # that command when a field changes.
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text().splitlines()
    start = page.index("| key | type | default | meaning |")
    end = next((i for i in range(start, len(page)) if not page[i].startswith("|")), len(page))
    generated = baton_cli("config", "--reference", check=True).stdout.splitlines()
    assert page[start:end] == generated


def test_allow_change_help_names_every_key_the_drift_check_allows(capsys):
    from baton.cli import main
    from baton.session.drift import ALLOWABLE

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"{key}: {' '.join(what.split())}" in text for key, what in ALLOWABLE.items())


def test_allow_change_refusal_and_help_name_each_key_once(capsys):
    """A key is either one --allow-change allows or one that changes freely, never both, and the refusal and
    the help name the same keys as the drift check compares."""
    import re

    from baton.cli import main
    from baton.errors import BatonError
    from baton.session.drift import ALLOWABLE, FROZEN_KEYS, validate_allowed

    with pytest.raises(BatonError) as e:
        validate_allowed(["optim.lr"])
    m = re.search(r"allowable: (.*); other settings such as (.*) or the number of ranks may change without it",
                  str(e.value))
    assert m, str(e.value)
    allowable, free = m[1].split(", "), m[2].split(", ")
    assert allowable == list(ALLOWABLE)
    assert not set(free) & (set(ALLOWABLE) | set(FROZEN_KEYS)), free
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"other settings such as {m[2]} or the number of ranks may change without it" in text


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    """`baton config | head -1`: the pipe's reader has gone before the command writes (its end is closed before
    the process starts, so the write fails every time): no internal error, no traceback, a shell's SIGPIPE status."""
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([sys.executable, "-m", "baton.cli", "config", "--reference"], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=600, check=False, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert p.returncode == 141 and p.stderr == "", p.stderr
