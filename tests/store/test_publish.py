"""Publishing a run as a Hugging Face model repository on the local Hub server, read back with the unmodified
client: the model at the root loads and generates, the card parses and carries the run's numbers, an
interrupted publish is finished by a rerun without ever showing a card over unverified files, and bad input
stops before any upload. `baton eval --step N` scores any verified checkpoint as the run scored it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, snapshot_download

from support.helpers import write_config
from support.store_backends import FAST_RETRY, HubBackend

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "loss_curve.png"}


def hub_env(b: HubBackend) -> dict[str, str]:
    return {"HF_ENDPOINT": b.proxy.url, "HF_TOKEN": b.hub.token, "HF_HUB_DISABLE_XET": "1"}


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "baton.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.fixture(scope="module")
def published(tmp_path_factory, prepared_data, hub_server):
    """One 20-step run with publish.url on the Hub server and publish.every=10: checkpoints 10 and 20 kept."""
    base = tmp_path_factory.mktemp("published")
    b = HubBackend(hub_server, FAST_RETRY)
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    r = cli("train", "-c", str(cfg), "--no-progress", "--set", "train.ckpt_every=10", "--set", "store.keep_last=4",
            "--set", f"publish.url=hf://{b.repo}", "--set", "publish.every=10", env=hub_env(b))
    assert r.returncode == 0, r.stderr
    yield b, cfg, base
    b.close()


def download(b: HubBackend, dest: Path, revision: str | None = None) -> Path:
    return Path(snapshot_download(b.repo, endpoint=b.hub.url, token=b.hub.token, revision=revision,
                                  cache_dir=dest / "cache", local_dir=dest / "model"))


def results(card: ModelCard) -> dict[tuple[str, str], float]:
    return {(r.dataset_type, r.metric_type): r.metric_value for r in card.data.eval_results}


def test_horizon_publishes_a_loadable_model_whose_card_holds_the_run(published, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    b, _, base = published
    summary = json.loads((base / "runs" / "test" / "run_summary.json").read_text())
    folder = download(b, tmp_path)
    assert MODEL_FILES | {"README.md"} <= {p.name for p in folder.iterdir()}
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == summary["params"]
    out = pipeline("text-generation", model=str(folder))("def ", max_new_tokens=8, do_sample=False)
    assert out[0]["generated_text"].startswith("def ") and len(out[0]["generated_text"]) > 4

    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and card.data.license == "apache-2.0"
    assert "baton" in card.data.tags
    record = json.loads((base / "store" / "test" / "eval" / "20.json").read_text())
    got = results(card)
    assert abs(got[("baton-heldout", "loss")] - summary["val_loss"]) < 1e-6
    assert got[("baton-heldout", "bits_per_byte")] == round(record["heldout"]["bits_per_byte"], 6)
    assert record["tokens_seen"] == summary["tokens_consumed"]
    for number in (f"{summary['params']:,}", f"{summary['tokens_consumed']:,}"):
        assert number in card.text
    manifest = json.loads((Path(summary["config"]["data"]["dir"]) / "manifest.json").read_text())
    assert manifest["fingerprint"] in card.text and "![training loss](loss_curve.png)" in card.text
    assert "## Limitations" in card.text and "not instruction-tuned" in card.text  # said from the run's numbers
    assert f"pretrained from scratch on {summary['tokens_consumed']:,} tokens" in card.text
    assert "intermediate checkpoint" not in card.text and "- CPU hours billed to the run" in card.text

    # publish.every=10: step 10 is the branch step-10, with its own card
    branch = download(b, tmp_path / "rev", revision="step-10")
    card10 = ModelCard.load(branch / "README.md")
    assert "step 10" in card10.text and MODEL_FILES <= {p.name for p in branch.iterdir()}
    assert "An intermediate checkpoint: step 10 of the run's 20-step horizon" in card10.text
    # Its example loads what it describes: the branch, not main's finished model.
    assert f'pipeline("text-generation", model="{b.repo}", revision="step-10")' in card10.text
    assert f'pipeline("text-generation", model="{b.repo}")' in card.text
    assert b.hub.read(b.repo, "model.safetensors", "step-10") != b.hub.read(b.repo, "model.safetensors")


def test_eval_of_any_verified_step_scores_as_the_run_did(published, tmp_path):
    """eval --step 20 gives the run's own final held-out loss; eval --step 10 gives what transformers computes on
    the export of step 10 over the same windows (to 1e-4)."""
    from transformers import AutoModelForCausalLM

    from baton.config import load_config
    from baton.data.reader import WindowDataset
    from baton.evaluate.run import run_eval
    from baton.model.export import export_run

    _, cfg, base = published
    summary = json.loads((base / "runs" / "test" / "run_summary.json").read_text())
    c = load_config(cfg)
    final, _ = run_eval(c, step=20, files=[], tasks=[])
    assert abs(final.heldout["loss"] - summary["val_loss"]) < 1e-4
    early, key = run_eval(c, step=10, files=[], tasks=[])
    assert key == "test/eval/10.json" and json.loads((base / "store" / key).read_text()) == early.to_json()

    out = export_run(c, "store", tmp_path / "step10", step=10)
    assert json.loads((out / "baton.json").read_text())["step"] == 10
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ds = WindowDataset(c.data.dir, c.data.seq_len, c.data.shuffle_seed, c.data.val_windows)
    with torch.no_grad():
        losses = [float(model(input_ids=r[None], labels=r[None]).loss) for r in ds.rows(ds.val_window_ids())]
    assert abs(sum(losses) / len(losses) - early.heldout["loss"]) < 1e-4
    assert early.heldout["loss"] > final.heldout["loss"]

    # Any store is a target: a local folder, the revision a folder step-10/ in it, the card from the same record.
    from baton.release.publish import publish

    out = publish(load_config(cfg, [f"publish.url={tmp_path / 'pub'}"]), 10, "step-10")
    folder = tmp_path / "pub" / "step-10"
    assert out["card"] == "step-10/README.md" and MODEL_FILES | {"README.md"} == {p.name for p in folder.iterdir()}
    card = ModelCard.load(folder / "README.md")
    assert results(card)[("baton-heldout", "loss")] == round(early.heldout["loss"], 6)
    assert AutoModelForCausalLM.from_pretrained(folder).config.num_hidden_layers == c.model.n_layers


def test_a_publish_reevaluates_when_what_the_config_evaluates_changed(published, tmp_path):
    """The step's evaluation record is reused only when it scored what [eval] names now: a file added, a file's
    content changed or a file dropped is evaluated again, and the card shows the new numbers; the same config
    twice reuses the record."""
    from baton.config import load_config
    from baton.evaluate.run import eval_key
    from baton.release.publish import publish

    _, cfg, base = published
    text = tmp_path / "notes.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    record = base / "store" / eval_key("test", 10)

    def card(files: list[str]) -> dict[tuple[str, str], float]:
        out = tmp_path / f"pub-{len(list(tmp_path.glob('pub-*')))}"
        publish(load_config(cfg, [f"publish.url={out}", f"eval.files={files}"]), 10)
        return results(ModelCard.load(out / "README.md"))

    with_file = card([str(text)])
    assert ("text-file", "loss") in with_file
    assert json.loads(record.read_text())["files"]["notes.txt"]["path"] == str(text)
    text.write_text("import os\nprint(os.getcwd())\n" * 20)  # same name, other content
    changed = card([str(text)])
    assert changed[("text-file", "loss")] != with_file[("text-file", "loss")]
    held = record.read_bytes()
    assert card([str(text)]) == changed and record.read_bytes() == held  # nothing changed: reused as it is
    assert ("text-file", "loss") not in card([]) and json.loads(record.read_text())["files"] == {}


def store_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_interrupted_publish_is_finished_by_a_rerun(published, hub_server, tmp_path, monkeypatch):
    """SIGKILL after the files are verified, before the card; then a store failing mid-upload of a new step over
    a published one: no card is ever shown over files it does not name, a rerun finishes, the store is untouched."""
    from baton.config import load_config
    from baton.errors import StoreError
    from baton.release.publish import publish

    _, cfg, base = published
    b = HubBackend(hub_server, FAST_RETRY)
    try:
        env = hub_env(b)
        before = store_digest(base / "store" / "test")
        trace = tmp_path / "trace"
        proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "publish", "-c", str(cfg), "--step", "10",
                                 "--set", f"publish.url=hf://{b.repo}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **env, "BATON_FAULT_TRACE": str(trace),
                                     "BATON_FAULT_PAUSE": "publish.card=60"})
        deadline = time.time() + 120
        while not (trace.is_file() and "publish.card" in trace.read_text()):
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        files = b.hub.files(b.repo)
        assert MODEL_FILES <= set(files) and "README.md" not in files

        for name, value in env.items():  # the client reads the endpoint and token from the environment, as in production
            monkeypatch.setenv(name, value)
        c = load_config(cfg, [f"publish.url=hf://{b.repo}", "store.retries=2", "store.retry_seconds=1"])
        assert publish(c, 10)["step"] == 10
        assert "step 10" in b.hub.read(b.repo, "README.md").decode()
        ten = b.hub.read(b.repo, "model.safetensors")

        # Step 20 over the published step 10, with the store failing the files' commit: the old card goes
        # first, so the root never shows step 10's card over step 20's files, nor a card over unverified ones.
        commits: list[str] = []

        def upload_commit(method: str, path: str) -> bool:  # the card's removal is commit 1; the files' is 2
            if method == "POST" and "/commit/" in path:
                commits.append(path)
                return len(commits) > 1
            return False

        b.fault("status", status=507, match=upload_commit)  # a full store: retried by baton, not by the client
        with pytest.raises(StoreError):
            publish(c, 20)
        assert "README.md" not in b.hub.files(b.repo) and b.hub.read(b.repo, "model.safetensors") == ten
        b.clear_faults()
        out = publish(c, 20)
        assert out["step"] == 20 and "step 20" in b.hub.read(b.repo, "README.md").decode()
        assert b.hub.read(b.repo, "model.safetensors") != ten
        assert store_digest(base / "store" / "test") == before
    finally:
        for k in ("HF_ENDPOINT", "HF_TOKEN"):
            os.environ.pop(k, None)
        b.close()


def test_bad_publish_input_is_one_line_before_any_upload(published, hub_server, tmp_path, monkeypatch):
    from baton.config import load_config
    from baton.errors import BatonError
    from baton.evaluate.run import run_eval
    from baton.model.export import export_run
    from baton.release.publish import publish

    _, cfg, _ = published
    b = HubBackend(hub_server, FAST_RETRY)
    try:
        for k, v in hub_env(b).items():
            monkeypatch.setenv(k, v)
        url = f"publish.url=hf://{b.repo}"
        r = cli("publish", "-c", str(cfg), "--set", url, "--step", "7", env=hub_env(b))
        assert r.returncode == 2 and r.stderr.strip() == (
            f"baton: error: step 7 is not a verified checkpoint of run 'test' in local store {cfg.parent / 'store'} "
            "(verified there: 10, 20; `baton status` lists them)")
        r = cli("train", "-c", str(cfg), "--set", url, "--set", f"eval.files=['{tmp_path / 'missing.txt'}']",
                "--set", "train.steps=30", env=hub_env(b))  # said before training, not at the horizon's publish
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"baton: error: eval file {tmp_path / 'missing.txt'} not found (fix eval.files or --files)"]
        c = load_config(cfg, [url])
        same_name = [str(tmp_path / d / "x.txt") for d in "ab"]  # the record names a file's scores by its name
        for f in same_name:
            Path(f).parent.mkdir()
            Path(f).write_text("x = 1\n")
        cases = [
            (lambda: publish(load_config(cfg, ["publish.url=hf://baton-test/no-such-repo"])), "was not found"),
            (lambda: load_config(cfg, ["publish.url=ftp://host/m"]), "publish.url ftp:// is not supported"),
            (lambda: publish(c, 7), "step 7 is not a verified checkpoint"),
            (lambda: run_eval(c, 7, [], []), "step 7 is not a verified checkpoint"),
            (lambda: export_run(c, "store", tmp_path / "x", 7), "step 7 is not a verified checkpoint"),
            (lambda: run_eval(c, 20, [str(tmp_path / "missing.txt")], []), "eval file"),
            (lambda: run_eval(c, 20, same_name, []), "eval files share the name(s) x.txt"),
        ]
        for fn, said in cases:
            with pytest.raises(BatonError) as e:
                fn()
            assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
        monkeypatch.setenv("HF_TOKEN", "hf_wrong_token_0123")
        with pytest.raises(BatonError, match="rejected the token"):
            publish(c)
        assert b.hub.files(b.repo) == {} and not any(s.method in ("PUT", "POST") for s in b.proxy.seen)
        assert not (tmp_path / "x").exists()
    finally:
        b.close()


TASK_YAML = """task: local_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
  - metric: byte_perplexity
"""


def test_lm_eval_on_a_local_task_improves_with_training(published, tmp_path, monkeypatch, capfd):
    """lm-evaluation-harness, offline, on a local loglikelihood_rolling task over a JSONL file: bits per byte
    are lower at step 20 than at step 10; the same file as an eval file is scored by baton too; an unknown
    task is refused before anything is pulled. Run outside a git checkout, the harness's git probe prints
    nothing to the terminal."""
    import textwrap

    from baton.config import load_config
    from baton.errors import BatonError
    from baton.evaluate.run import run_eval

    _, cfg, base = published
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    text = Path(textwrap.__file__).read_text()
    data = tmp_path / "local.jsonl"
    data.write_text("".join(json.dumps({"text": text[i : i + 600]}) + "\n" for i in range(0, 3000, 600)))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "local_text.yaml").write_text(TASK_YAML.format(data=data))
    c = load_config(cfg, [f"eval.task_dir={tasks}"])
    early, _ = run_eval(c, 10, [str(data)], ["local_text"])
    late, _ = run_eval(c, 20, [str(data)], ["local_text"])
    assert "not a git repository" not in capfd.readouterr().err
    # An unknown name makes the harness index all its own tasks first (seconds): asked once, last.
    with pytest.raises(BatonError, match="lm-eval task.*no_such_task not found"):
        run_eval(c, 10, [], ["local_text", "no_such_task"])
    assert early.tasks["local_text"]["bits_per_byte"] > late.tasks["local_text"]["bits_per_byte"] > 0
    assert early.files["local.jsonl"]["bits_per_byte"] > late.files["local.jsonl"]["bits_per_byte"]
    assert json.loads((base / "store" / "test" / "eval" / "20.json").read_text())["tasks"] == late.tasks


def test_a_token_that_may_not_write_is_refused_before_any_upload(make_config, hub_server, monkeypatch):
    """whoami names the token's rights: a read token, or a fine-grained one without repo.write on the target, is
    one line before anything is pulled or uploaded, for `baton publish`, `baton publish-data`, `baton eval` (it
    writes its record) and `baton train` on a Hub store or with a Hub publish target. A token with the right is let through; a server that cannot say is not a refusal
    (its 403 at the first upload is, as before)."""
    import baton
    from baton.errors import BatonError, StoreError
    from baton.release.publish import open_target, publish
    from baton.store.hub import HubStore

    b = HubBackend(hub_server, FAST_RETRY)
    owner = b.repo.split("/")[0]
    hub_server.create_repo(f"datasets/{b.repo}")
    try:
        monkeypatch.setenv("HF_ENDPOINT", b.proxy.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        cfg = make_config()
        read = hub_server.add_token({"role": "read"})
        other = hub_server.add_token({"role": "fineGrained", "fineGrained": {"scoped": [
            {"entity": {"type": "user", "name": owner}, "permissions": ["repo.content.read"]},
            {"entity": {"type": "model", "name": owner + "/other"}, "permissions": ["repo.write"]}]}})
        scoped = hub_server.add_token({"role": "fineGrained", "fineGrained": {"scoped": [
            {"entity": {"type": "model", "name": b.repo}, "permissions": ["repo.content.read", "repo.write"]}]},
        }, writes=True)
        c = baton.load_config(cfg, [f"publish.url=hf://{b.repo}"])
        for token, why in ((read, "a read token"), (other, "a fine-grained token without repo.write")):
            monkeypatch.setenv("HF_TOKEN", token)
            for fn in (lambda: publish(c), lambda: baton.train(c, progress=False),
                       lambda: baton.train(baton.load_config(cfg, [f"store.url=hf://{b.repo}"]), progress=False),
                       lambda: baton.publish_data(baton.load_config(cfg, [f"data.url=hf://datasets/{b.repo}"])),
                       lambda: baton.eval(baton.load_config(cfg, [f"store.url=hf://{b.repo}"]))):
                with pytest.raises(StoreError) as e:
                    fn()
                assert str(e.value) == (f"the token may not write to {b.repo} ({why}"
                                        + (f" on {owner} or {b.repo}" if token == other else "")
                                        + "): use a token with write access to it (HF_TOKEN or `hf auth login`)")
        assert not any(s.method in ("PUT", "POST") for s in b.proxy.seen) and b.hub.files(b.repo) == {}
        assert not (cfg.parent / "store").exists() and not (cfg.parent / "runs").exists()

        monkeypatch.setenv("HF_TOKEN", scoped)
        open_target(c)
        # The URL's own revision is made when missing, as --revision makes its branch; a bad URL names its key.
        assert open_target(baton.load_config(cfg, [f"publish.url=hf://{b.repo}?revision=dev"])).store.revision == "dev"
        assert (b.repo, "dev") in hub_server.branches
        with pytest.raises(BatonError, match="^publish.url 'hf://baton-test' must name a repository"):
            publish(baton.load_config(cfg, ["publish.url=hf://baton-test"]))
        with pytest.raises(BatonError, match="^data.url 'hf://baton-test' must name a repository"):
            baton.publish_data(baton.load_config(cfg, ["data.url=hf://baton-test"]))
        hub_server.serve_whoami = False  # no verdict: the upload's own 403 is the answer, still one line
        monkeypatch.setenv("HF_TOKEN", read)
        open_target(c)
        with pytest.raises(BatonError, match=r"may not write to .* \(HTTP 403\)"):
            HubStore.from_url(f"hf://{b.repo}", FAST_RETRY).write_text("probe.txt", "x")
    finally:
        hub_server.serve_whoami = True
        b.close()


def test_the_card_names_the_hub_datasets_read_and_a_finished_shortened_run_as_finished():
    """A run anytime mode shortened ends at its own horizon: its model is finished, not step N of the config's
    horizon. Hub sources are named by repository, in the metadata and the text; a saved dataset folder is a local
    path, never Hub metadata."""
    from baton.config import SourceConfig, load_config
    from baton.evaluate.record import EvalRecord
    from baton.release.modelcard import build_card

    cfg = load_config(None)
    cfg.data.sources = [SourceConfig(kind="hub", repo="HuggingFaceFW/fineweb-edu", files="sample/10BT/*.parquet"),
                        SourceConfig(kind="hf_dataset", path="/home/alice/private/ds_saved")]
    config = cfg.to_dict()
    manifest = {"fingerprint": "f" * 16, "total_tokens": 1000, "tokenizer": {"vocab_size": 4096}}

    def card(step: int, horizon: int) -> str:
        return str(build_card(repo="you/m", run="r", step=step, horizon=horizon, params=10, tokens_seen=100,
                              config=config, manifest=manifest, ledger={}, evaluation=EvalRecord(run="r", step=step, tokens_seen=100, heldout={}),
                              license="", tags=[], curve=None))

    text = card(636, 636)
    assert "intermediate checkpoint" not in text
    assert "An intermediate checkpoint: step 300 of the run's 636-step horizon" in card(300, 636)
    front = text.split("---")[1]
    assert "HuggingFaceFW/fineweb-edu" in front and "/home/alice" not in front
    assert "- hub: HuggingFaceFW/fineweb-edu@main (sample/10BT/*.parquet)" in text
