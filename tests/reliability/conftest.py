"""Fixtures for the reliability tests: a zygote that starts `baton` processes quickly, the S3 test server,
and fake, recognisable store credentials that must never appear in any output."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from support.fake_credentials import FAKE_HF_TOKEN, FAKE_KEY, FAKE_SECRET
from support.zygote import Zygote

# Variables of the machine running the tests that would point boto3 elsewhere.
UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@pytest.fixture(scope="session")
def fake_env(tmp_path_factory) -> dict[str, str]:
    """The environment of every process these tests start: fake credentials only, no ~/.aws of the machine."""
    none = tmp_path_factory.getbasetemp() / "no-aws-config-reliability"
    return {"AWS_ACCESS_KEY_ID": FAKE_KEY, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(none), "AWS_SHARED_CREDENTIALS_FILE": str(none), "HF_TOKEN": FAKE_HF_TOKEN,
            # The test Hub serves the classic LFS path; huggingface_hub reads this switch once, at import.
            "HF_HUB_DISABLE_XET": "1"}


@pytest.fixture(scope="session")
def zygote(fake_env):
    z = Zygote(env=fake_env, unset=UNSET)
    yield z
    z.close()


@pytest.fixture(scope="session")
def moto():
    from support.store_servers import MotoServer

    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(moto):
    """make() -> (bucket name, raw boto3 client): a fresh bucket on the S3 test server."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1", aws_access_key_id=FAKE_KEY,
                          aws_secret_access_key=FAKE_SECRET, config=Config(s3={"addressing_style": "path"}))

    def make() -> str:
        name = f"rel-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=name)
        return name

    return make


@pytest.fixture(scope="session")
def base(zygote, prepared_data, tmp_path_factory) -> Path:
    """A run with a verified checkpoint at step 2, on its own copy of the prepared data (read-only by
    convention: the bad-input tests damage copies of it)."""
    from support.helpers import write_config

    b = tmp_path_factory.mktemp("bad-input")
    shutil.copytree(prepared_data, b / "corpus")
    cfg = write_config(b / "cfg.toml", data_dir=b / "corpus", store=b / "store", runs=b / "runs")
    r = zygote.run(["train", "-c", str(cfg), "--no-progress", "--stop-after-steps", "2"], b / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    return b


@pytest.fixture(scope="session")
def exported(base, tmp_path_factory) -> Path:
    """The base run's model, exported once (read-only by convention)."""
    from baton.cli import main

    out = tmp_path_factory.mktemp("exported") / "model"
    assert main(["export", "-c", str(base / "cfg.toml"), "--out", str(out)]) == 0
    return out
