"""`baton publish`: a verified checkpoint as a Hugging Face model repository, at the root of ``publish.url``.

The order is the guarantee, as for checkpoints: the exported model files (weights, config, generation
config, tokenizer, loss curve) are pushed and verified first; the model card ``README.md`` is written last
and read back. A card left by an earlier publish is removed before any file changes, so the target never
shows a card that names files not yet verified: a publish cut short leaves verified files and no card,
and running it again finishes it. The checkpoint store is only read, except for the evaluation record
``<run>/eval/<step>.json`` (written when none exists yet for what the config's [eval] names).

Intermediate checkpoints go to revisions ``step-N``: branches of a Hub repository, folders ``step-N/``
elsewhere.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import faults
from ..checkpoint.cycle import push_folder, store_key
from ..config import Config
from ..errors import BatonError, StoreError
from ..evaluate.record import EvalRecord
from ..guard import local_store_root, output_place, shown
from ..planning import ledger as L
from ..runs import split_run
from ..store import RetryPolicy, Store, open_store, safe_key

log = logging.getLogger(__name__)

CARD = "README.md"


@dataclass
class Target:
    store: Store
    prefix: str  # "" for the root of the repository (or of the revision's branch)
    repo: str  # what `from_pretrained` is given: owner/name on the Hub, else the URL (and the revision's folder)
    revision: str = ""  # the Hub branch it is published to, when not main (`from_pretrained(..., revision=)`)

    def describe(self) -> str:
        return self.store.describe() + (f" under {self.prefix}/" if self.prefix else "")


def open_target(cfg: Config, revision: str | None = None) -> Target:
    """The publish target, proven reachable with the configured credentials before anything is uploaded."""
    url = cfg.publish.url
    if not url:
        raise BatonError("publish.url is empty: set [publish] url = \"hf://owner/model-repo\" (or a path, s3://, "
                         "file://) in the config or pass --set publish.url=...")
    if revision:
        try:  # a folder under the target, or a branch: relative, without '..', both ways
            safe_key(revision)
        except StoreError:
            raise BatonError(f"--revision {shown(revision)} must be a relative name without '.', '..' or empty parts "
                             "(e.g. step-1000)") from None
    retry = RetryPolicy.from_config(cfg.store)
    if url.startswith("hf://"):
        from ..store.hub import HubStore

        store = HubStore.from_url(url, retry, key="publish.url")
        target = Target(store, "", store.repo_id)
        _probe(target)
        store.check_write_access()  # a read-only token is said here, not at the first upload
        # The branch to publish to (--revision, else the URL's ?revision=) is made if missing: from the URL's
        # revision, or from main for the URL's own.
        branch, start = (revision, store.revision) if revision and revision != store.revision else \
            (store.revision, "main")
        if branch != "main":
            store._call(lambda: store.api.create_branch(store.repo_id, branch=branch, revision=start,
                                                        repo_type=store.repo_type, exist_ok=True),
                        f"creation of branch {branch}")
            store.revision = branch
            target.revision = branch
        return target
    root = local_store_root(url, "publish.url")
    if root is not None:  # a local folder: reading proves nothing about writing, a probe write does
        output_place(root / (revision or ""), "publish.url", "set publish.url to a folder you may write")
    target = Target(open_store(url, retry, key="publish.url"), revision or "",
                    f"{url.rstrip('/')}/{revision}" if revision else url)
    if root is None:
        _probe(target)
    return target


def _probe(target: Target) -> None:
    """A read with the credentials that will write: a wrong token, a missing repository or bucket show
    here, before the first upload."""
    try:
        target.store.read_text(store_key(target.prefix, CARD))
    except StoreError as e:
        raise BatonError(f"cannot publish to {target.describe()}: {e}") from None


def _ledger_summary(store: Store, run: str) -> dict[str, Any]:
    # A cooldown branch's model cost its main run's sessions too: the family's ledgers, as a quota counts them.
    records, _ = L.read_run_ledgers(store, run)
    t = L.totals(records)
    devices = sorted({f"{r.accelerators} x {r.device}" for r in records if r.device})
    return {"billed_hours": round(t.billed_hours, 6), "sessions": t.sessions, "devices": devices}


def publish_folder(cfg: Config, target: Target, folder: Path, step: int, config: dict[str, Any],
                   evaluation: EvalRecord, metrics: Path | None, horizon: int) -> dict[str, Any]:
    """Push the exported ``folder`` (plus the loss curve) to ``target``, verify it, then write the card.
    ``horizon``: the run's own, which anytime mode may have shortened from the config's (a model at it is
    finished, not an intermediate checkpoint)."""
    from ..config import config_from_dict
    from ..data.manifest import load_manifest
    from ..model.llama import param_count
    from .modelcard import LOSS_CURVE, build_card, loss_curve

    saved = config_from_dict(config)
    store = target.store
    curve = loss_curve(metrics, folder / LOSS_CURVE, evaluation.heldout.get("loss")) \
        if metrics is not None else None
    (folder / "baton.json").unlink(missing_ok=True)  # the card carries the provenance
    card_key = store_key(target.prefix, CARD)
    if store.read_text(card_key) is not None:
        from ..store import delete_keys

        delete_keys(store, [card_key])
    files, _ = push_folder(store, folder, target.prefix, cfg.store.verify,
                           what=f"model of step {step} at {target.describe()}")
    faults.point("publish.card", step)
    ckpt_store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    card = build_card(repo=target.repo, run=cfg.run.name, step=step, horizon=horizon, revision=target.revision,
                      params=param_count(saved.model), tokens_seen=step * saved.tokens_per_step, config=config,
                      manifest=load_manifest(cfg.data.dir), ledger=_ledger_summary(ckpt_store, cfg.run.name),
                      evaluation=evaluation, license=cfg.publish.license, tags=cfg.publish.tags,
                      curve=LOSS_CURVE if curve else None)
    text = str(card)
    store.write_text(card_key, text)
    if store.read_text(card_key) != text:
        raise StoreError(f"the model card {card_key} read back from {target.describe()} differs from what was written")
    log.info("published step %d to %s: %d files verified, then the model card", step, target.describe(), len(files))
    return {"target": target.describe(), "step": step, "files": sorted(files), "card": card_key}


def publish(cfg: Config, step: int | None = None, revision: str | None = None) -> dict[str, Any]:
    """`baton publish`: the verified checkpoint at ``step`` (None: the pointer's) to ``publish.url``; a cooldown
    branch's at the revision named for it unless ``revision`` says otherwise."""
    if revision is None and split_run(cfg.run.name)[1] is not None:
        revision = final_revision(cfg)
    from ..checkpoint.history import locate
    from ..checkpoint.state import METRICS_FILE
    from ..config import config_from_dict
    from ..data.manifest import load_manifest
    from ..data.prepare import TOKENIZER_FILE
    from ..evaluate.run import Plan, evaluate_model, read_record, write_record
    from ..model.export import checkpoint_model, export_model

    target = open_target(cfg, revision)
    ckpt_store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    wanted = locate(ckpt_store, cfg.run.name, step).step  # a step not in the store fails here, before uploads
    plan = Plan(cfg)
    evaluation = read_record(ckpt_store, cfg.run.name, wanted, plan.spec())  # reused only if it scored what cfg names
    eos = load_manifest(cfg.data.dir)["tokenizer"]["eos_token"]  # a missing data folder is said before the pull
    with tempfile.TemporaryDirectory(prefix="baton-publish-") as tmp:
        model, state = checkpoint_model(cfg, "store", Path(tmp), wanted)
        folder = export_model(model, Path(cfg.data.dir) / TOKENIZER_FILE, Path(tmp) / "model", eos)
        if evaluation is None:
            evaluation = evaluate_model(cfg, plan, model, state.step, state.config, folder)
            write_record(ckpt_store, evaluation)
        metrics = Path(tmp) / "ckpt" / METRICS_FILE
        return publish_folder(cfg, target, folder, state.step, state.config, evaluation,
                              metrics if metrics.is_file() else None,
                              state.horizon(config_from_dict(state.config).total_steps))


def publish_trained(cfg: Config, model, step: int, folder: Path, metrics: Path | None,
                    revision: str = "") -> dict[str, Any]:
    """From a training session: the model in memory and its export ``folder`` (left as it is), at ``step``."""
    import shutil

    from ..evaluate.run import Plan, evaluate_model, read_record, write_record

    target = open_target(cfg, revision)
    plan = Plan(cfg)
    ckpt_store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    with tempfile.TemporaryDirectory(prefix="baton-publish-") as tmp:
        staged = Path(shutil.copytree(folder, Path(tmp) / "model"))
        evaluation = read_record(ckpt_store, cfg.run.name, step, plan.spec())
        if evaluation is None:
            evaluation = evaluate_model(cfg, plan, model, step, cfg.to_dict(), staged)
            write_record(ckpt_store, evaluation)
        # Called when the run completes: its step is the horizon it reached, the config's or anytime mode's.
        return publish_folder(cfg, target, staged, step, cfg.to_dict(), evaluation, metrics, step)


def final_revision(cfg: Config) -> str:
    """Where a run's finished model is published: the main revision; a cooldown branch's at a revision named for
    it (``anneal-<step>-<tokens>``), beside the main run's."""
    return split_run(cfg.run.name)[1] or ""


def revision_for(cfg: Config, step: int, total_steps: int) -> str | None:
    """Where training publishes checkpoint ``step``: the final revision at the horizon, ``step-N`` at a
    multiple of publish.every, nowhere otherwise. A cooldown branch publishes its final model only: its steps'
    ``step-N`` are the main run's revisions."""
    if not cfg.publish.url:
        return None
    if step >= total_steps:
        return final_revision(cfg)
    if cfg.publish.every and step % cfg.publish.every == 0 and split_run(cfg.run.name)[1] is None:
        return f"step-{step}"
    return None
