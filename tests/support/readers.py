"""Reading back what each tracker holds, with the tracker's own library: W&B's offline run files (its
protobuf records), MLflow's client, TensorBoard's event accumulator."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768  # W&B's transaction log is LevelDB's log format: 32 KiB blocks of framed records
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += room
            continue
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(b"".join(chunks))
            chunks = []
            yield rec


def wandb_runs(wandb_dir: Path) -> list[tuple[str, list[tuple[int, dict[str, float]]]]]:
    """(run id, [(step, values)]) for each offline run folder, oldest first: one per session."""
    out = []
    for folder in sorted(wandb_dir.glob("offline-run-*")):
        (f,) = folder.glob("run-*.wandb")
        run_id, rows = None, []
        for rec in _wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run_id = rec.run.run_id
            elif kind == "history":
                values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                rows.append((int(values.pop("_step")), {k: v for k, v in values.items() if not k.startswith("_")}))
        out.append((run_id, rows))
    return out


def mlflow_steps(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)]


def tensorboard_steps(logdir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]
