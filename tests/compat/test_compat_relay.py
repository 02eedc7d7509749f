"""The commands a person types, on the library versions people have (support/compat_envs.py).

Each environment gets the same smoke relay, every step a real `baton` command in a process of that
environment: prepare, a session stopped at a boundary, a second one on an emptied work folder that resumes
from the store, export and sample, one bench cell, and a relay through a Hub store on the local Hub server.
No command may end in an internal error. In the environment without extras, every command either works or
names the extra it needs in one line.

These build virtual environments (minutes on a fresh machine, reused after): `make test` runs them with the
rest, first (`pytest --compat`); a run without --compat deselects them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from baton.extras import EXTRAS
from support.compat_envs import build, envs, installed
from support.helpers import write_config

pytestmark = pytest.mark.compat

ENVS = envs()


class Relay:
    def __init__(self, env, work: Path, extra_env: dict[str, str] | None = None):
        self.env, self.work = env, work
        self.vars = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra_env or {})}
        self.vars.pop("VIRTUAL_ENV", None)
        self.outputs: list[str] = []

    def __call__(self, *args: str, expect: int = 0, cwd: Path | None = None, **extra: str
                 ) -> subprocess.CompletedProcess:
        r = subprocess.run([str(self.env.bin / "baton"), *args], cwd=cwd or self.work, capture_output=True,
                           text=True, timeout=900, env={**self.vars, **extra})
        said = f"$ baton {' '.join(args)}\n{r.stdout}\n{r.stderr}"
        self.outputs.append(said)
        assert "internal error" not in r.stderr, said
        assert r.returncode == expect, said
        return r


def _built(name: str, tmp_path_factory):
    e = ENVS[name]
    return build(e, tmp_path_factory.mktemp(f"build-{e.name}") / "install.log")


@pytest.fixture(scope="module", params=list(ENVS))
def env(request, tmp_path_factory):
    return _built(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[name for name, e in ENVS.items() if e.absent])
def bare_env(request, tmp_path_factory):
    return _built(request.param, tmp_path_factory)


def test_the_environment_is_the_one_it_claims(env):
    got = installed(env)
    for dist, pattern in env.expect.items():
        assert re.fullmatch(pattern, got["versions"][dist]), (env.name, dist, got["versions"][dist])
    assert not any(got["importable"].values()), got["importable"]


def test_a_relay_on_a_local_store_and_on_the_hub(env, tmp_path, hub_server):
    work = tmp_path / "work"
    cfg = write_config(work / "run.toml", data_dir=work / "data", store=work / "store", runs=work / "runs",
                       run_name="compat")
    baton = Relay(env, work)
    baton("prepare", "-c", str(cfg))

    first = baton("train", "-c", str(cfg), "--set", "train.steps=8", "--stop-after-steps", "4")
    assert "starting run 'compat' at step 0" in first.stdout + first.stderr
    shutil.rmtree(work / "runs")  # a new machine: only the store and the data are left
    second = baton("train", "-c", str(cfg), "--set", "train.steps=8")
    assert "resumed at step 4" in second.stdout + second.stderr, second.stderr
    pointer = json.loads((work / "store" / "compat" / "latest.json").read_text())
    assert pointer["step"] == 8 and pointer["complete"]

    baton("export", "-c", str(cfg), "--set", "train.steps=8", "--out", str(work / "exported"))
    sample = baton("sample", "--from", str(work / "exported"), "--prompt", "def ", "--max-new-tokens", "8")
    assert sample.stdout.strip()

    # preflight's cheap stages: the model's shape built on the meta device, the data, the store's proof.
    baton("preflight", "-c", str(cfg), "--stages", "construct,data,storage", "--out", str(work / "pf"))
    assert json.loads((work / "pf" / "preflight.json").read_text())["verdict"] == "PASS"

    bench = baton("bench", "-c", str(cfg), "--attn", "sdpa", "--seq", "32", "--micro", "4", "--grad-ckpt", "off",
                  "--warmup", "0", "--steps", "1", "--out", str(work / "bench"))
    cells = json.loads((work / "bench" / "bench.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["ok"]
    if "matplotlib" in env.absent:
        assert 'bench.png left out: matplotlib is not installed (pip install "baton[plot]")' in bench.stderr
    else:
        assert (work / "bench" / "bench.png").read_bytes()[:4] == b"\x89PNG"

    # The same relay through a Hub store (huggingface_hub's own client: httpx on 1.x, httpx2 on 2.x).
    hub_server.create_repo(f"me/compat-{env.name}")
    hub = {"HF_ENDPOINT": hub_server.url, "HF_TOKEN": hub_server.token, "HF_HUB_DISABLE_XET": "1"}
    to_hub = ("--set", f"store.url=hf://me/compat-{env.name}", "--set", "train.steps=6")
    baton("train", "-c", str(cfg), *to_hub, "--stop-after-steps", "3", **hub)
    shutil.rmtree(work / "runs")
    resumed = baton("train", "-c", str(cfg), *to_hub, **hub)
    assert "resumed at step 3" in resumed.stdout + resumed.stderr, resumed.stderr
    assert json.loads(hub_server.read(f"me/compat-{env.name}", "compat/latest.json"))["step"] == 6

    # Muon is torch.optim.Muon (torch 2.9): on an older torch, one line naming the version, nothing written.
    has_muon = subprocess.run([str(env.bin / "python"), "-c", "import torch; assert hasattr(torch.optim, 'Muon')"],
                              capture_output=True, timeout=300).returncode == 0
    muon = baton("train", "-c", str(cfg), "--set", "optim.name=muon", "--set", "run.name=muon", "--set",
                 "train.steps=2", expect=0 if has_muon else 2)
    if not has_muon:
        assert muon.stderr.strip().splitlines()[-1].startswith(
            'baton: error: optim.name = "muon" needs torch.optim.Muon, which torch 2.9 and newer have'), muon.stderr
        assert not (work / "store" / "muon").exists()


def test_without_extras_every_command_works_or_names_its_extra(bare_env, tmp_path):
    env = bare_env
    work = tmp_path / "work"
    cfg = str(write_config(work / "run.toml", data_dir=work / "data", store=work / "store", runs=work / "runs",
                           run_name="bare"))
    baton = Relay(env, work)
    baton("prepare", "-c", cfg)
    baton("train", "-c", cfg, "--set", "train.steps=4")

    report = baton("report", "-c", cfg, "--out", str(work / "report"))
    assert "the report's plots left out: matplotlib is not installed (pip install \"baton[plot]\")" in report.stderr
    assert "Not drawn: matplotlib is not installed" in (work / "report" / "report.md").read_text()
    simulate = baton("simulate", "-c", cfg, "--session-hours", "1", "--runs", "20", "--out", str(work / "sim"))
    assert "the simulator plots left out" in simulate.stderr

    def refused(*args: str, extra: str) -> None:
        r = baton(*args, expect=2)
        (line,) = r.stderr.strip().splitlines()[-1:]
        assert line.startswith("baton: error: ") and f'pip install "baton[{extra}]"' in line, r.stderr

    refused("train", "-c", cfg, "--set", "store.url=s3://bucket/runs", extra="s3")
    refused("train", "-c", cfg, "--set", 'log.backends=["jsonl","tensorboard"]', extra="tensorboard")
    refused("eval", "-c", cfg, "--tasks", "hellaswag", extra="eval")
    parquet = work / "docs.parquet"
    parquet.write_bytes(b"PAR1")  # never read: the missing library is said first
    refused("prepare", "-c", cfg, "--set", "data.dir=" + str(work / "data2"), "--set",
            f'data.sources=[{{kind="parquet", path="{parquet}"}}]', extra="data")


# Every module of the package imported in the environment's own interpreter. A module may fail only on a library
# of a declared extra that the environment lacks (the bare one): a library imported that no extra brings, or an
# attribute an older release lacks at import time, is what this catches (the httpx of huggingface_hub 1.x was one).
IMPORT_ALL = r"""
import importlib, importlib.util, json, pkgutil
import baton
failed = {}
for m in pkgutil.walk_packages(baton.__path__, "baton."):
    if m.name.endswith(".__main__"):  # a command, run on import
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        lib = (e.name or "").split(".")[0]
        failed[m.name] = [lib, importlib.util.find_spec(lib) is not None]
print(json.dumps(failed))
"""

# The Python API's session and a compiled bench cell, in the environment's torch: what the process gets back when
# baton.train returns (runtime/process.py), the backward compiled with the forward where torch can
# (runtime/compiled.py; a no-op before), the compile scope's fallback and the fresh compile per cell (bench.py).
# AOTAutograd without code generation ("aot_eager"): the same dynamo and autograd path as on a GPU, no C++ build.
API_RUN = r"""
import sys, torch, baton
from baton import bench
from baton.config import load_config
from baton.runtime import compiled
compiled.BACKEND = "aot_eager"
cfg = load_config(sys.argv[1], ["train.steps=2", "train.compile=true", "train.threads=1", "run.name=api"])
torch.set_num_threads(2)
torch.manual_seed(1)
want = torch.rand(3)
torch.manual_seed(1)
summary = baton.train(cfg, progress=False)
assert summary["steps_done"] == 2 and summary["compile_fallbacks"] == [], summary
assert torch.get_num_threads() == 2 and torch.equal(torch.rand(3), want), "the process was not put back"
cells = bench.run_grid(cfg, ["sdpa"], [32], [2, 4], [False], [True], 128, torch.device("cpu"), warmup=0, steps=1)
assert [c.status for c in cells] == ["ok", "ok"] and not any(c.reason for c in cells), [(c.status, c.reason) for c in cells]
print("api ok on torch", torch.__version__)
"""


def test_every_module_imports_and_the_python_api_runs(env, tmp_path):
    python = str(env.bin / "python")
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run_env.pop("VIRTUAL_ENV", None)
    got = subprocess.run([python, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=600, env=run_env)
    assert got.returncode == 0, got.stderr[-3000:]
    failed = json.loads(got.stdout.strip().splitlines()[-1])
    # only on the library of an extra this environment does not have
    assert all(lib in EXTRAS and not there for lib, there in failed.values()), (env.name, failed)

    work = tmp_path / "work"
    cfg = write_config(work / "run.toml", data_dir=work / "data", store=work / "store", runs=work / "runs",
                       run_name="compat")
    Relay(env, work)("prepare", "-c", str(cfg))
    api = subprocess.run([python, "-c", API_RUN, str(cfg)], cwd=work, capture_output=True, text=True, timeout=900,
                         env=run_env)
    assert api.returncode == 0 and "api ok on torch" in api.stdout, api.stdout[-2000:] + api.stderr[-4000:]
    version = subprocess.run([python, "-m", "baton", "--version"], capture_output=True, text=True, timeout=300,
                             env=run_env)
    assert version.returncode == 0 and version.stdout.startswith("baton "), version.stderr
