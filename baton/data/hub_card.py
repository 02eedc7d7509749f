"""The configs a Hub dataset declares: its README.md's YAML front matter, ``configs:`` by the Hub's convention.

Each entry names a ``config_name`` and its ``data_files``: one glob (the train split), a list of globs (the
train split), a list of ``{split, path}`` tables (``path`` one glob or several), or a table of split -> glob(s).
A source's ``config`` and ``split`` resolve to the globs of that entry, read at the pinned commit, so the files
they select are as fixed as the commit.
"""

from __future__ import annotations

import re
from typing import Any

from .. import extras
from ..errors import DataError

README = "README.md"
FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
DEFAULT_SPLIT = "train"  # the split a bare glob or list of globs stands for


def declared_configs(readme: str | None, where: str) -> dict[str, dict[str, list[str]]]:
    """config name -> split -> globs, as ``readme`` (None: the repository has no README.md) declares them;
    ``where`` names the repository and commit in the one-line error for a card that cannot be read."""
    yaml = extras.require("yaml", "reading a Hub dataset's configs")

    fix = "select the files with files = \"...\" instead"
    m = FRONT_MATTER.match(readme or "")
    if m is None:
        raise DataError(f"{where} declares no configs (no README.md with YAML front matter): {fix}")
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 2}" if mark is not None else ""
        raise DataError(f"{where}: the YAML front matter of its {README} does not parse{at}: {fix}") from None
    entries = meta.get("configs") if isinstance(meta, dict) else None
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{where} declares no configs (its {README} has no configs: list): {fix}")
    out: dict[str, dict[str, list[str]]] = {}
    for entry in entries:
        name = entry.get("config_name") if isinstance(entry, dict) else None
        splits = _splits(entry.get("data_files")) if isinstance(entry, dict) else None
        if not isinstance(name, str) or splits is None:
            raise DataError(f"{where}: its {README} declares a config that is not a config_name with data_files "
                            f"({str(entry)[:80]}): {fix}")
        out[name] = splits
    return out


def _splits(files: Any) -> dict[str, list[str]] | None:
    """split -> globs of one ``data_files`` value; None when it is none of the Hub's forms."""
    if isinstance(files, str):
        return {DEFAULT_SPLIT: [files]}
    if isinstance(files, dict):
        files = [{"split": k, "path": v} for k, v in files.items()]
    if not isinstance(files, list) or not files:
        return None
    if all(isinstance(f, str) for f in files):
        return {DEFAULT_SPLIT: list(files)}
    out: dict[str, list[str]] = {}
    for f in files:
        path = f.get("path") if isinstance(f, dict) else None
        paths = [path] if isinstance(path, str) else path
        if not isinstance(f, dict) or not isinstance(f.get("split"), str) or not isinstance(paths, list) or not (
                paths and all(isinstance(p, str) for p in paths)):
            return None
        out.setdefault(f["split"], []).extend(paths)
    return out


def config_globs(readme: str | None, config: str, split: str, where: str) -> list[str]:
    """The globs of ``config``'s ``split``; an unknown config or split is one line naming the choices."""
    configs = declared_configs(readme, where)
    if config not in configs:
        raise DataError(f"{where} declares no config {config!r} (its configs: {', '.join(configs)}): set config to "
                        "one of them")
    splits = configs[config]
    if split not in splits:
        raise DataError(f"{where}: config {config!r} has no split {split!r} (its splits: {', '.join(splits)}): set "
                        "split to one of them")
    return splits[split]
