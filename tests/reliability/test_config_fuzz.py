"""Generated configs and overrides (property-based): whatever the input, loading either gives a valid config
or raises a ConfigError whose message names the problem, never another exception; through the CLI that
is exit 0 or exit 2 with one `baton: error:` line, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from baton.config import Config, load_config
from baton.errors import ConfigError

SECTIONS = {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}
FIELDS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in SECTIONS.items()}

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.sampled_from([0, 1, 2, 3, 7, 64, 1 << 40, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "fp16", "bf16", "sdpa", "stdlib", "s3://b/p", "hf://o/r", "../x", "a/b"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


@st.composite
def raw_configs(draw) -> dict:
    out: dict = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "extra"]), unique=True, max_size=len(SECTIONS) + 1)):
        known = FIELDS.get(section, [])
        keys = draw(st.lists(st.one_of(st.sampled_from(known or ["x"]), st.text(min_size=1, max_size=8)),
                             unique=True, max_size=6))
        out[section] = {k: draw(values) for k in keys}
    if draw(st.booleans()):
        out[draw(st.text(min_size=1, max_size=8))] = draw(scalars)  # a stray top-level value
    return out


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(raw: dict) -> str:
    top = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    tables = [f"[{json.dumps(k)}]\n" + "\n".join(f"{json.dumps(n)} = {toml_value(x)}" for n, x in v.items())
              for k, v in raw.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n" + "\n\n".join(tables) + "\n"


def _load_or_error(path, overrides=()) -> Config | ConfigError:
    try:
        return load_config(path, list(overrides))
    except ConfigError as e:
        return e


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=raw_configs())
def test_generated_configs_load_or_fail_with_a_config_error(raw, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "c.toml"
    path.write_text(to_toml(raw))
    got = _load_or_error(path)
    if isinstance(got, ConfigError):
        assert str(got).startswith("invalid config") or "not valid TOML" in str(got)
    else:
        got.validate()  # a config that loads is valid, and survives its own JSON round trip
        assert _load_or_error(None, [f"{s}.{k}={json.dumps(v) if isinstance(v, str) else toml_value(v)}"
                                     for s, fields in got.to_dict().items() if isinstance(fields, dict)
                                     for k, v in fields.items() if not isinstance(v, (list, dict))]) is not None


overrides = st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda s, k, v: f"{s}.{k}={v}", st.sampled_from([*SECTIONS, "nope"]),
              st.one_of(st.sampled_from(sum(FIELDS.values(), [])), st.text(max_size=6)),
              st.one_of(st.text(max_size=12), scalars.map(toml_value))),
), max_size=5)


@settings(max_examples=300, deadline=None)
@given(sets=overrides)
@example(sets=["model.hidden=1000000000000", "model.n_heads=7"])  # once made validation hang (a divisor scan)
def test_generated_overrides_load_or_fail_with_a_config_error(sets):
    got = _load_or_error(None, sets)
    assert isinstance(got, (Config, ConfigError))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(raw=raw_configs())
def test_generated_configs_through_the_command(raw, zygote, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(to_toml(raw))
    r = zygote.run(["config", "-c", str(path)], tmp_path / "out", timeout=60)
    assert "Traceback" not in r.stderr
    if r.returncode == 0:
        json.loads(r.stdout)  # the resolved config
    else:
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.startswith("baton: error: "), r.stderr[-2000:]
