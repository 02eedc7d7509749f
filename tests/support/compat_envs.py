"""Virtual environments with the library versions users have, each with baton installed from this checkout.

The suite itself runs on one environment: the newest release of everything, every extra installed. Users
have older libraries (a notebook image pins what it was built with) and fewer of them (`pip install baton`
brings no extra). Each environment here is one such set, built once into ``.compat/<name>`` and reused
while pyproject.toml and its recipe are unchanged; baton is installed editable, so its code is always this
checkout's.

- ``lowest``: every direct dependency at the lowest version pyproject.toml declares (uv's
  ``--resolution lowest-direct``), with the extras the smoke relay uses (hub, s3, plot).
- ``notebook``: what notebook images carry: huggingface_hub 1.x, transformers 5.0.x, the oldest torch the
  declared range admits, everything else current.
- ``bare``: ``pip install baton`` with the ordinary pip: no extra at all, the newest releases.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".compat"


def declared_floor(package: str) -> str:
    """The lowest version pyproject.toml admits for a direct dependency (``torch>=2.4`` -> ``2.4``)."""
    from baton.config import tomllib  # the standard library's, or tomli on Python 3.10

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(rf"{re.escape(package)}\s*>=\s*([\w.]+)(?:\s*,.*)?", dep.split(";")[0].strip())
        if m:
            return m.group(1)
    raise LookupError(f"pyproject.toml declares no floor for {package}")


@dataclass(frozen=True)
class Env:
    name: str
    installer: str  # "uv" or "pip"
    target: str  # what is installed from the checkout: "." or ".[extras]"
    options: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    # distribution -> a regular expression its installed version must match (the set is what it claims to be)
    expect: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # modules that must not be importable

    @property
    def path(self) -> Path:
        return HOME / self.name

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def recipe(self) -> str:
        return json.dumps([self.installer, self.target, self.options, self.pins, sys.version_info[:2],
                           hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()])


def envs() -> dict[str, Env]:
    torch_floor = declared_floor("torch")
    tf_floor = declared_floor("transformers")
    return {e.name: e for e in (
        Env("lowest", "uv", ".[hub,s3,plot]", options=("--resolution", "lowest-direct"),
            expect={"torch": rf"{re.escape(torch_floor)}(\.0)*(\+.*)?", "transformers": rf"{re.escape(tf_floor)}(\.0)*",
                    "huggingface-hub": r"1\..*", "numpy": r"1\..*"}),
        Env("notebook", "uv", ".[hub,plot]",
            pins=(f"torch=={torch_floor}.*", "transformers>=5.0,<5.1", "huggingface_hub>=1,<2"),
            expect={"torch": rf"{re.escape(torch_floor)}\..*", "transformers": r"5\.0\..*", "huggingface-hub": r"1\..*"}),
        Env("bare", "pip", ".", absent=("matplotlib", "boto3", "pyarrow", "datasets", "lm_eval", "tensorboard",
                                        "wandb", "mlflow", "liger_kernel")),
    )}


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise RuntimeError("uv is not installed: pip install -e '.[test]' brings it")
    return found


def build(env: Env, log: Path) -> Env:
    """Create ``env`` unless it exists with the same recipe; its install output goes to ``log``. Test processes
    that need it at once take turns (a file lock): the first builds, the others find it built."""
    HOME.mkdir(parents=True, exist_ok=True)
    with (HOME / f"{env.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _build(env, log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(env: Env, log: Path) -> Env:
    stamp = env.path / ".recipe"
    if stamp.exists() and stamp.read_text() == env.recipe():
        return env
    shutil.rmtree(env.path, ignore_errors=True)
    env.path.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        def run(*cmd: str) -> None:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            r = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
            if r.returncode:
                raise RuntimeError(f"building the {env.name} environment failed: see {log}")

        if env.installer == "uv":
            run(_uv(), "venv", "--quiet", "--python", sys.executable, str(env.path))
            run(_uv(), "pip", "install", "--python", str(env.bin / "python"), *env.options, "-e", env.target,
                *env.pins)
        else:
            run(sys.executable, "-m", "venv", str(env.path))
            run(str(env.bin / "python"), "-m", "pip", "install", "--quiet", "-e", env.target)
    stamp.write_text(env.recipe())
    return env


def installed(env: Env) -> dict[str, object]:
    """{"versions": distribution -> version, "importable": module -> bool} inside ``env``."""
    names = sorted(env.expect) + ["torch", "transformers", "huggingface-hub", "tokenizers", "safetensors", "numpy"]
    code = ("import importlib.metadata as m, importlib.util as u, json, sys;"
            f"names = {sorted(set(names))!r}; mods = {list(env.absent)!r};"
            "print(json.dumps({'versions': {n: m.version(n) for n in names},"
            " 'importable': {x: u.find_spec(x) is not None for x in mods}}))")
    out = subprocess.run([str(env.bin / "python"), "-c", code], capture_output=True, text=True, timeout=300,
                         check=True)
    return json.loads(out.stdout)
