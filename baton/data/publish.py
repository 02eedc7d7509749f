"""`baton publish-data` (and `baton prepare --publish`): a prepared data folder into ``data.url``, verified.

Each file is checked against the folder's manifest before it leaves (one sha256 pass: a damaged local
shard is never published), uploaded through the store protocol, and the whole set verified the way a
checkpoint is (``baton.checkpoint.cycle.verify_remote``: the store's listing of size and sha256, then
ranged read-backs checked against ``Content-Range`` and the local bytes). ``manifest.json`` goes last and
is read back: until it is there, the location holds no dataset a training session would take.

Resumable: a rerun (after a kill, an outage) lists the store first and uploads only the files it does not
already hold with the manifest's size and sha256. Uploads run a few at a time (``data.transfer_workers``),
each streamed from disk, so memory stays bounded whatever the corpus. Replacing another dataset at the
same location removes its manifest first, so no reader ever sees the old manifest over new shards.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import faults
from ..checkpoint.cycle import verify_remote
from ..config import Config
from ..errors import DataError, VerificationError
from ..hashing import sha256_file
from ..store import Store, check_write_access, put_files
from .manifest import MANIFEST, load_manifest, manifest_problems, parse_manifest
from .remote import data_store, dataset_files, same_folder

log = logging.getLogger(__name__)

# The Hub makes a commit per batch: a killed publish loses at most the batch in flight, not the whole upload.
HUB_COMMIT_FILES = 16


@dataclass
class PublishReport:
    location: str
    fingerprint: str
    files: int
    uploaded: int
    uploaded_bytes: int
    already_held: int
    removed: int
    seconds: float

    def line(self) -> str:
        return (f"published {self.files} files (+ {MANIFEST}) to {self.location}: {self.uploaded} uploaded "
                f"({self.uploaded_bytes / 1e6:,.1f} MB), {self.already_held} already held and verified, "
                f"{self.removed} stale removed; fingerprint {self.fingerprint}, verified in {self.seconds:.1f} s")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def publish(cfg: Config) -> PublishReport:
    t0 = time.perf_counter()
    folder = Path(cfg.data.dir)
    m = load_manifest(folder)
    problems = manifest_problems(m)
    if problems:
        raise DataError(f"{folder / MANIFEST} does not agree with itself ({problems[0]}); rerun `baton prepare`")
    store = data_store(cfg)
    check_write_access(store)  # a Hub token that may only read: said before any upload
    if same_folder(store, folder):
        raise DataError(f"data.url is data.dir itself ({folder}): nothing to publish (point data.url at another "
                        "folder or a remote store)")
    files = dataset_files(m)
    _check_local(folder, files, cfg.data.transfer_workers)
    text = (folder / MANIFEST).read_text(encoding="utf-8")
    held_text = store.read_text(MANIFEST)
    listing = store.list("")
    held = {n for n, want in files.items() if (got := listing.get(n)) is not None
            and got.size == want["size"] and got.sha256 == want["sha256"]}
    if held_text is not None and held_text != text:
        _replacing(store, held_text, m)
    todo = [n for n in files if n not in held]
    if held:
        log.info("%s already holds %d of %d files with the manifest's size and sha256; not uploaded again",
                 store.describe(), len(held), len(files))
    _upload(store, folder, todo, files, cfg.data.transfer_workers)
    # Shards of an earlier dataset at this location would make it disagree with the new manifest.
    stale = sorted(k for k in listing if "/" not in k and k.startswith("shard-") and k not in files)
    for key in stale:
        store.delete(key)
    verify_remote(store, "", files, folder, cfg.store.verify, what=f"dataset {m['fingerprint']}")
    if held_text != text:
        faults.point("data.publish")
        store.write_text(MANIFEST, text)
    back = store.read_text(MANIFEST)
    if back != text:
        raise VerificationError(f"{MANIFEST} read back from {store.describe()} differs from {folder / MANIFEST}; "
                                "rerun `baton publish-data`")
    report = PublishReport(store.describe(), m["fingerprint"], len(files), len(todo),
                           sum(files[n]["size"] for n in todo), len(held), len(stale), time.perf_counter() - t0)
    return report


def _check_local(folder: Path, files: dict[str, dict[str, Any]], workers: int) -> None:
    """Every file exists and hashes to the manifest's sha256 (sizes are filled in for the tokenizer)."""
    def check(name: str) -> str | None:
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        files[name]["size"] = path.stat().st_size
        got = sha256_file(path)
        return None if got == files[name]["sha256"] else f"{name} has sha256 {got[:12]}…, the manifest says " \
                                                           f"{str(files[name]['sha256'])[:12]}…"

    with ThreadPoolExecutor(max(1, workers)) as pool:  # hashlib releases the GIL
        problems = [p for p in pool.map(check, list(files)) if p]
    if problems:
        raise DataError(f"{folder} does not match its manifest ({'; '.join(problems[:3])}"
                        f"{'; …' if len(problems) > 3 else ''}): not published; rerun `baton prepare`")


def _replacing(store: Store, held_text: str, m: dict[str, Any]) -> None:
    try:
        old = parse_manifest(held_text, f"{MANIFEST} in {store.describe()}").get("fingerprint")
    except DataError:
        old = "unreadable"
    log.warning("%s holds another dataset (fingerprint %s); replacing it with %s. Runs that trained on the old "
                "one refuse to resume on the new one unless --allow-change data.fingerprint",
                store.describe(), old, m["fingerprint"])
    # First the manifest: a reader then finds no dataset, never the old manifest over new shards.
    store.delete(MANIFEST)


def _upload(store: Store, folder: Path, names: list[str], files: dict[str, dict[str, Any]], workers: int) -> None:
    if not names:
        return
    if getattr(store, "put_files", None) is not None:
        # A store with commits (the Hub) uploads a batch in one commit, in parallel inside the client.
        for i in range(0, len(names), HUB_COMMIT_FILES):
            batch = names[i : i + HUB_COMMIT_FILES]
            faults.point("data.publish", i)
            put_files(store, [(folder / n, n, files[n]["sha256"]) for n in batch])
        return

    def put(item: tuple[int, str]) -> None:
        i, name = item
        faults.point("data.publish", i)
        sent = store.put_file(folder / name, name, files[name]["sha256"])
        if sent != files[name]["sha256"]:
            raise DataError(f"{name} changed while it was uploaded (sha256 {sent[:12]}… sent, the manifest says "
                            f"{files[name]['sha256'][:12]}…); rerun `baton publish-data`")

    with ThreadPoolExecutor(max(1, min(workers, len(names)))) as pool:
        list(pool.map(put, enumerate(names)))
