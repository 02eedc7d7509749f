"""Retention survives a kill: a SIGKILL aimed at every point between the last pointer roll and the end of
pruning, on every store, ends, after the next session, with exactly ``keep_last`` checkpoints.

The run is three steps with a checkpoint after each and ``keep_last = 2``: the horizon's cycle rolls the
pointer to step 3 and must delete step 1. The kill lands (a real SIGKILL, aimed by a pause at the named
point of that cycle) after the pointer is written and before its read-back, before the pruning lists the
store, or just before the old checkpoint's deletion. The next session completes the run (evaluation, the
final model, the completed pointer) and must also finish the pruning the killed one never did.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from support.chaos import LocalView, S3View
from support.fake_credentials import FAKE_HF_TOKEN, FAKE_KEY, FAKE_SECRET

KEEP = 2
ARGS = ["--no-progress", "--set", "train.steps=3", "--set", "train.ckpt_every=1", "--set", f"store.keep_last={KEEP}",
        "--set", "data.val_windows=4"]
# (point, the step its trace line names in the horizon's cycle: the pointer's step, or the deleted checkpoint's)
POINTS = [("pointer.readback", 3), ("prune", 3), ("prune.delete", 1)]


class HubView:
    """The test Hub's own record of a repository, read behind baton's back."""

    def __init__(self, server, repo: str):
        self.server, self.repo = server, repo

    def read(self, key: str) -> bytes | None:
        try:
            return self.server.read(self.repo, key)
        except KeyError:
            return None

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.server.repos[self.repo] if k.startswith(prefix))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from support.store_hub_server import HubServer

    server = HubServer(tmp_path_factory.mktemp("hub"), token=FAKE_HF_TOKEN).start()
    yield server
    server.stop()


def _store(kind: str, tmp_path: Path, request):
    """(store URL, environment for baton, an independent view of the store)."""
    if kind == "local":
        return str(tmp_path / "store"), {}, LocalView(tmp_path / "store")
    if kind == "s3":
        moto, bucket = request.getfixturevalue("moto"), request.getfixturevalue("s3_bucket")()
        return (f"s3://{bucket}/runs?endpoint={moto.url}", {},
                S3View(moto.url, bucket, "runs", FAKE_KEY, FAKE_SECRET))
    server = request.getfixturevalue("hub")
    repo = f"baton-test/prune-{uuid.uuid4().hex[:10]}"
    server.create_repo(repo)
    return f"hf://{repo}", {"HF_ENDPOINT": server.url}, HubView(server, repo)


def _checkpoints(view) -> list[int]:
    return sorted({int(k.split("/")[2][len("step-"):]) for k in view.keys("test/ckpt/")})


@pytest.mark.parametrize("point, step", POINTS, ids=[p for p, _ in POINTS])
@pytest.mark.parametrize("kind", ["local", "s3", "hub"])
def test_a_kill_during_retention_is_finished_by_the_next_session(kind, point, step, zygote, make_config, tmp_path,
                                                                    request):
    url, env, view = _store(kind, tmp_path, request)
    cfg = str(make_config(store=url))
    trace = tmp_path / "trace"
    child = zygote.spawn(["train", "-c", cfg, *ARGS], tmp_path / "out",
                         env={**env, "BATON_FAULT_TRACE": str(trace), "BATON_FAULT_PAUSE": f"{point}@{step}=120"})
    deadline = time.monotonic() + 300
    aimed = f"{point} {step} "
    while not (trace.exists() and any(line.startswith(aimed) for line in trace.read_text().splitlines())):
        assert child.alive(), f"the session ended before {point}: {child.stderr_text()[-3000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child.kill()
    assert child.wait(60).returncode == -9
    pointer = json.loads(view.read("test/latest.json"))
    assert pointer["step"] == 3 and not pointer.get("complete")
    assert _checkpoints(view) == [1, 2, 3]  # the kill left the old checkpoint behind

    r = zygote.run(["train", "-c", cfg, *ARGS], tmp_path / "out", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    pointer = json.loads(view.read("test/latest.json"))
    assert pointer["complete"] and pointer["step"] == 3
    assert _checkpoints(view) == [2, 3]
    assert "finished the pruning an earlier session left undone: removed ckpt/step-1" in r.stderr
