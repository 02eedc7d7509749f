"""The examples as a user runs them: the notebooks under a real Jupyter kernel (this interpreter's, through
ipykernel), the spot-VM script as a process that gets SIGTERM. SMOKE mode, the shared prepared corpus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from support.helpers import read_metrics

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def kernel_manager(tmp_path_factory):
    """A kernel spec that runs ipykernel on this interpreter, whatever kernels the machine has registered."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kernels = tmp_path_factory.mktemp("kernels")
    write_kernel_spec(kernels / "baton-test")
    ksm = KernelSpecManager(kernel_dirs=[str(kernels)])
    return lambda: KernelManager(kernel_name="baton-test", kernel_spec_manager=ksm)


def execute(name: str, workdir: Path, kernel_manager, **params) -> tuple[nbformat.NotebookNode, Exception | None]:
    """Run the notebook with ``params`` injected after its parameters cell (as papermill does)."""
    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    injected = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(injected, metadata={"tags": ["injected-parameters"]}))
    workdir.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(nb, km=kernel_manager(), timeout=600, resources={"metadata": {"path": str(workdir)}})
    try:
        client.execute()
    except CellExecutionError as e:
        return nb, e
    return nb, None


def text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type == "error":
            out.append("\n".join(o.traceback))
        elif "text/plain" in o.get("data", {}):
            out.append(o.data["text/plain"])
    return "".join(out)


def train_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code" and "baton.train(" in c.source)


def pointer(store: Path, run: str = "smoke") -> dict:
    return json.loads((store / run / "latest.json").read_text())


def smoke(tmp_path: Path, prepared_data: Path, **more) -> dict:
    return {"SMOKE": True, "SMOKE_CONFIG": str(EXAMPLES / "smoke.toml"), "WORK_DIR": str(tmp_path / "work"),
            "DATA_DIR": str(prepared_data), **more}


def test_colab_notebook_trains_then_a_second_execution_resumes_from_the_store(kernel_manager, prepared_data, tmp_path):
    store = tmp_path / "work" / "store"
    nb, err = execute("colab", tmp_path / "cwd", kernel_manager, **smoke(tmp_path, prepared_data, STOP_AFTER_STEPS=4))
    assert err is None, err
    assert pointer(store)["step"] == 4
    assert "verified checkpoint at step 4 of 8" in text(nb.cells[-1])
    cell = train_cell(nb)
    assert "starting run 'smoke' at step 0" in text(cell)
    # tqdm's auto mode draws a widget in a notebook, not a text bar.
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.outputs)

    nb, err = execute("colab", tmp_path / "cwd", kernel_manager, **smoke(tmp_path, prepared_data))
    assert err is None, err
    assert "auto-resume" in text(train_cell(nb)) and "resumed from step 4" in text(train_cell(nb))
    p = pointer(store)
    assert p["step"] == 8 and p["complete"]
    assert "verified checkpoint at step 8 of 8" in text(nb.cells[-1]) and "(run complete)" in text(nb.cells[-1])
    assert [r["step"] for r in read_metrics(tmp_path / "work" / "runs" / "smoke")] == list(range(1, 9))


def test_kaggle_notebook_trains_on_two_ranks_with_their_output_in_the_cell(kernel_manager, prepared_data, tmp_path):
    nb, err = execute("kaggle_2xT4", tmp_path / "cwd", kernel_manager, **smoke(tmp_path, prepared_data, NPROC=2))
    assert err is None, err
    out = text(train_cell(nb))
    assert "baton.runtime.agent --nproc-per-node 2" in out  # the launcher of `baton train --nproc 2`
    assert "starting run 'smoke' at step 0" in out  # rank 0's log, copied from its process into the cell
    assert "session ended at step 8 of 8" in out
    p = pointer(tmp_path / "work" / "store")
    assert p["step"] == 8 and p["complete"]
    logs = tmp_path / "work" / "runs" / "smoke" / "logs"
    assert (logs / "rank-0.log").exists() and (logs / "rank-1.log").exists()


def test_a_wrong_token_is_one_line_in_the_cell(kernel_manager, prepared_data, tmp_path, monkeypatch):
    from support.store_hub_server import HubServer

    hub = HubServer(tmp_path / "hub").start()
    try:
        wrong = "hf_" + "x" * 30  # a token from another account, or pasted with a typo
        monkeypatch.setenv("HF_TOKEN", wrong)  # what the secret cell exports, outside Colab
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        nb, err = execute("colab", tmp_path / "cwd", kernel_manager,
                          **smoke(tmp_path, prepared_data, STORE_URL="hf://me/smoke-store"))
    finally:
        hub.stop()
    assert err is not None
    cell = train_cell(nb)
    (error,) = [o for o in cell.outputs if o.output_type == "error"]
    # One line, the CLI's, naming the cause and the fix: no traceback.
    (line,) = error.traceback
    # The first read of the store is the run's lease, taken before anything is written (docs/concurrency.md).
    assert line.startswith("baton: error: read of smoke/lease failed in Hub store hf://me/")
    assert line.endswith("the Hub rejected the token (HTTP 401): check HF_TOKEN or `hf auth login`")
    assert all(wrong not in text(c) for c in nb.cells)


def test_spot_vm_script_stops_on_sigterm_with_a_verified_checkpoint(prepared_data, tmp_path):
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "spot_vm.py"), "--smoke", "--work-dir", str(work),
                             "--data-dir", str(prepared_data), "--set", "train.steps=2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = work / "runs" / "smoke" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and read_metrics(metrics.parent)):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no step within 300 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # the VM is being reclaimed
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    p = pointer(work / "store")
    assert 0 < p["step"] < 2000 and not p.get("complete")
    assert f"verified checkpoint in the store: step {p['step']}" in out
    assert read_metrics(metrics.parent)[-1]["step"] == p["step"]
