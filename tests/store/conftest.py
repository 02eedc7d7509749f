"""Fixtures for the store tests: a moto S3 server for the session, faulty proxies, and one ``Backend``
handle per store kind that the contract and tamper tests are parametrized over."""

from __future__ import annotations

import pytest

from baton.store import RetryPolicy
from support.store_backends import AWS_TEST_KEY, AWS_TEST_SECRET, FAST_RETRY, HubBackend, LocalBackend, S3Backend
from support.store_servers import FaultyProxy, MotoServer


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path_factory):
    """Test credentials only, no ~/.aws of the machine running the tests, and no Xet uploads."""
    none = tmp_path_factory.getbasetemp() / "no-aws-config"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_TEST_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_TEST_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(none))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(none))
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    # The test Hub serves the classic LFS path; the client reads this switch when it uploads.
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


@pytest.fixture(scope="session")
def moto_server():
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3_proxy(moto_server):
    proxy = FaultyProxy(moto_server.url).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def make_backend(tmp_path, request):
    """make_backend(kind) -> a Backend with a fresh, empty store of that kind."""
    made = []

    def make(kind: str, retry: RetryPolicy = FAST_RETRY):
        if kind == "local":
            b = LocalBackend(tmp_path / f"local-{len(made)}", retry)
        elif kind == "s3":
            moto = request.getfixturevalue("moto_server")
            b = S3Backend(moto.url, retry, name=f"{request.node.name}-{len(made)}")
        elif kind == "hub":
            hub = request.getfixturevalue("hub_server")
            b = HubBackend(hub, retry, name=f"{request.node.name}-{len(made)}")
        else:
            raise ValueError(kind)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


KINDS = ["local", "s3", "hub"]


@pytest.fixture(params=KINDS)
def backend(request, make_backend):
    return make_backend(request.param)


@pytest.fixture(params=["local", "s3"])
def backend_no_hub(request, make_backend):
    return make_backend(request.param)


def pytest_configure(config):
    # huggingface_hub passes file bodies to httpx2 as ``data=``, which httpx2 deprecates; not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:Use 'content=<...>':DeprecationWarning")
