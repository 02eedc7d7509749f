"""Every config field carries its own rules (help text, bounds in its metadata, choices in its Literal type), and
``Config.validate`` enforces each of them, whichever field it is: the cases are generated from the metadata."""

from __future__ import annotations

import dataclasses
import re
import types
import typing

import pytest

from baton.config import Config, SourceConfig, reference_table
from baton.errors import ConfigError

SECTIONS = [*typing.get_type_hints(Config).items(), ("data.sources[0]", SourceConfig)]
FIELDS = [(where, f, typing.get_type_hints(cls)[f.name]) for where, cls in SECTIONS for f in dataclasses.fields(cls)]
BOUNDS = [(f"{where}.{f.name}", kind, bound, tp) for where, f, tp in FIELDS
          for kind, bound in f.metadata["bounds"].items()]
CHOICES = [f"{where}.{f.name}" for where, f, tp in FIELDS
           if typing.Literal in {typing.get_origin(m) for m in (tp, *typing.get_args(tp))}]
BEYOND = {"gt": 0, "ge": -1, "lt": 0, "le": 1}  # offset from the bound to the nearest refused whole value


def _set(key: str, value: object) -> Config:
    cfg = Config()
    where, name = key.rsplit(".", 1)
    section = cfg.data.sources[0] if where == "data.sources[0]" else getattr(cfg, where)
    setattr(section, name, value)
    return cfg


def _problems(cfg: Config) -> str:
    try:
        cfg.validate()
    except ConfigError as e:
        return str(e)
    return ""


def _number(tp: object, value: float) -> float:
    return float(value) if float in (typing.get_args(tp) or (tp,)) else int(value)


def test_every_field_has_help_text():
    assert [f"{where}.{f.name}" for where, f, _ in FIELDS if not f.metadata.get("help")] == []
    assert len(BOUNDS) > 40 and len(CHOICES) >= 10  # the metadata is there to generate the cases below


@pytest.mark.parametrize("key, kind, bound, tp", BOUNDS, ids=[f"{k}-{kind}" for k, kind, _, _ in BOUNDS])
def test_a_value_beyond_a_declared_bound_is_refused(key, kind, bound, tp):
    value = _number(tp, bound + BEYOND[kind])
    assert f"{key} must be " in _problems(_set(key, value)) and f"got {value}" in _problems(_set(key, value))
    if kind in ("ge", "le"):  # the bound itself is inside
        assert f"{key} must be " not in _problems(_set(key, _number(tp, bound)))


@pytest.mark.parametrize("key", CHOICES)
def test_a_value_outside_a_fields_choices_is_refused(key):
    assert f"{key}='nope' is " in _problems(_set(key, "nope"))


def _wrong_type(tp: object) -> object:
    """A value of a type the field does not take: a string for a list (never iterated letter by letter), a
    number for text, text for a number, a list for a number-or-keyword."""
    if typing.get_origin(tp) is list:
        return "notes.txt"
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [1]
    return 12 if tp is str or typing.get_origin(tp) is typing.Literal else "12"


@pytest.mark.parametrize("where, f, tp", FIELDS, ids=[f"{where}.{f.name}" for where, f, _ in FIELDS])
def test_a_field_set_in_place_to_a_wrong_type_is_a_config_error(where, f, tp):
    value = _wrong_type(tp)
    assert _problems(_set(f"{where}.{f.name}", value)).startswith(f"invalid config: {where}.{f.name} "), value


@pytest.mark.parametrize("section", [name for name, _ in SECTIONS if "." not in name])
def test_a_section_replaced_by_a_table_is_a_config_error(section):
    cfg = Config()
    setattr(cfg, section, {})
    assert _problems(cfg).startswith(f"invalid config: {section} must be a ")


def test_problems_come_in_field_order_then_the_cross_field_rules():
    cfg = Config()
    cfg.train.log_every, cfg.model.attn, cfg.optim.lr, cfg.model.hidden = 0, "x", -1.0, 102  # type: ignore[assignment]
    lines = _problems(cfg).splitlines()[1:]
    assert lines == ["  - model.attn='x' is not one of auto, eager, sdpa, flash_attention_2",
                     "  - optim.lr must be > 0, got -1.0",
                     "  - train.log_every must be > 0, got 0",
                     "  - model.hidden=102 is not divisible by model.n_heads=4 (no n_heads near it divides hidden "
                     "into even head dims in groups of n_kv_heads=2: change hidden, e.g. to 96)"]
    # Each suggestion passes the other rules too: hidden 100 over 3 heads, one KV head: 4 would give head dim 25.
    cfg = Config()
    cfg.model.hidden, cfg.model.n_heads, cfg.model.n_kv_heads = 100, 3, 1
    assert "e.g. 1, 2, 5)" in _problems(cfg)


def test_the_reference_shows_choices_and_bounds_from_the_types_and_metadata():
    rows = {key: (tp, default, meaning) for key, tp, default, meaning in reference_table()}
    assert rows["model.attn"][:2] == ("auto | eager | sdpa | flash_attention_2", '"auto"')
    assert rows["model.attn"][2].startswith("attention implementation: eager, sdpa, flash_attention_2, or auto")
    assert rows["train.micro_batch"][0] == "int | auto, > 0"
    assert rows["train.compile"][0] == "auto | bool"
    assert rows["optim.beta1"][0] == "float, in [0, 1)" and rows["optim.muon_ns_steps"][0] == "int, in [1, 99]"
    assert rows["data.sources[].weight"][0] == "float, > 0"
    assert len(rows) == len(FIELDS)


INT_FIELDS = [f"{where}.{f.name}" for where, f, tp in FIELDS if tp is int]


@pytest.mark.parametrize("key", INT_FIELDS)
def test_a_whole_number_past_64_bits_is_refused_by_name(key, tmp_path):
    """Every int ends in a 64-bit one (torch's seeds, numpy's arrays): one that does not fit is the config's error,
    not an OverflowError after the lease and the ledger were written."""
    from baton.config import load_config

    section, name = key.rsplit(".", 1)
    table = "[[data.sources]]" if section == "data.sources[0]" else f"[{section}]"
    for value in (1 << 64, -(1 << 63) - 1):
        (tmp_path / "c.toml").write_text(f"{table}\n{name} = {value}\n")
        with pytest.raises(ConfigError, match=re.escape(f"{key} = {value} does not fit a 64-bit integer")):
            load_config(tmp_path / "c.toml")


def test_an_unquoted_toml_datetime_is_the_text_it_was(tmp_path):
    from baton.config import load_config

    (tmp_path / "c.toml").write_text("[budget]\nquota_hours = 5\nquota_reset = 2026-09-26T00:00:00Z\n")
    assert load_config(tmp_path / "c.toml").budget.quota_reset == "2026-09-26T00:00:00+00:00"


def test_a_tokenizer_baton_would_train_larger_than_the_embedding_is_refused_before_prepare():
    from baton.config import load_config

    with pytest.raises(ConfigError, match=r"data.tokenizer_vocab=1024 exceeds model.vocab_size=512: the trained "
                                          r"tokenizer's ids would not fit the embedding"):
        load_config(None, ["data.tokenizer_vocab=1024", "model.vocab_size=512"])
    load_config(None, ["data.tokenizer_vocab=1024", "model.vocab_size=512", "data.tokenizer=tok.json"])  # its own
