"""One handle per store kind for the shared tests: the store baton uses, plus the means to damage it.

``store`` is what baton talks to (through a faulty proxy for the HTTP backends); the other methods act
on the store behind baton's back, as corruption, a misbehaving server or an outage would.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
from botocore.config import Config

from baton.store import RangeRead, RetryPolicy
from baton.store.local import LocalStore
from support.store_servers import Fault, FaultyProxy

# Fast, still bounded retrying: the tests prove the behaviour, not the production delays.
FAST_RETRY = RetryPolicy(attempts=3, max_seconds=5.0, base=0.01, cap=0.05)
AWS_TEST_KEY = "AKIDBATONTEST0000001"
AWS_TEST_SECRET = "batonTestSecret/DoNotPrint+0123456789abcd"


class FaultyLocalStore(LocalStore):
    """A local store whose ranged reads can misbehave like a broken server (the local analogue of the proxy)."""

    fault: Fault | None = None

    def read_range(self, key: str, start: int, end: int) -> RangeRead:
        f = self.fault
        if f is None or f.kind not in ("ignore_range", "shift_range", "lie_range") or not f.match("GET", key):
            return super().read_range(key, start, end)
        if f.times is not None and f.hits >= f.times:
            return super().read_range(key, start, end)
        f.hits += 1
        size = (self.root / key).stat().st_size
        if f.kind == "ignore_range":
            data = (self.root / key).read_bytes()
            return RangeRead(data, 200, None)
        k = f.shift if start >= f.shift else -f.shift
        if start + k < 0:
            k = f.shift
        r = super().read_range(key, start + k, end + k)
        if f.kind == "lie_range":
            return RangeRead(r.data, 206, f"bytes {start}-{end}/{size}")
        return r


class Backend:
    kind = ""
    store = None

    def flip(self, key: str, offset: int, service_checksum: bool = True) -> None:
        """Change one byte of the stored object. ``service_checksum``: the service's own checksum (where it
        keeps one) follows the new bytes, as a server that computed it would; else only baton's claims remain."""
        raise NotImplementedError

    def remove(self, key: str) -> None:
        raise NotImplementedError

    def raw(self, key: str) -> bytes:
        raise NotImplementedError

    def fault(self, kind: str, **kw) -> Fault:
        raise NotImplementedError

    def clear_faults(self) -> None:
        raise NotImplementedError

    def go_down(self) -> None:
        raise NotImplementedError

    def come_back(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalBackend(Backend):
    kind = "local"

    def __init__(self, base: Path, retry: RetryPolicy):
        base.mkdir(parents=True)
        self.real = base / "store-data"
        self.real.mkdir()
        # The store is reached through a symlink, like a mount point that can go away.
        self.link = base / "store"
        self.link.symlink_to(self.real)
        self.store = FaultyLocalStore(self.link, retry)

    def flip(self, key: str, offset: int, service_checksum: bool = True) -> None:
        p = self.real / key
        data = bytearray(p.read_bytes())
        data[offset] ^= 0xFF
        p.write_bytes(bytes(data))

    def remove(self, key: str) -> None:
        (self.real / key).unlink()

    def raw(self, key: str) -> bytes:
        return (self.real / key).read_bytes()

    def fault(self, kind: str, **kw) -> Fault:
        if kind in ("drop", "status"):
            raise ValueError("use go_down for the local store")
        match = kw.pop("match", None) or (lambda m, p: True)
        self.store.fault = Fault(kind, match=match, **kw)
        return self.store.fault

    def clear_faults(self) -> None:
        self.store.fault = None

    def go_down(self) -> None:
        self.link.unlink()
        self.link.symlink_to(self.real.with_name("gone"))

    def come_back(self) -> None:
        self.link.unlink()
        self.link.symlink_to(self.real)


_RAW: dict[str, object] = {}


def raw_s3_client(endpoint: str):
    """A plain client straight to the server (not through the proxy), for setting up and tampering."""
    if endpoint not in _RAW:
        _RAW[endpoint] = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                      config=Config(s3={"addressing_style": "path"}))
    return _RAW[endpoint]


class ProxiedBackend(Backend):
    """An HTTP backend that baton reaches through a FaultyProxy (``self.proxy``): its faults are the proxy's."""

    def fault(self, kind: str, **kw) -> Fault:
        match = kw.pop("match", None) or (lambda m, p: True)
        return self.proxy.add(Fault(kind, match=match, **kw))

    def clear_faults(self) -> None:
        self.proxy.clear()

    def go_down(self) -> None:
        self.proxy.add(Fault("drop"))

    def come_back(self) -> None:
        self.proxy.clear()

    def close(self) -> None:
        self.proxy.stop()


class S3Backend(ProxiedBackend):
    kind = "s3"

    def __init__(self, moto_url: str, retry: RetryPolicy, name: str = ""):
        from baton.store.s3 import S3Store

        self.moto_url = moto_url
        self.bucket = f"baton-{uuid.uuid4().hex[:16]}"
        self.prefix = "runs/p"
        self.client = raw_s3_client(moto_url)
        self.client.create_bucket(Bucket=self.bucket)
        self.proxy = FaultyProxy(moto_url).start()
        self.url = f"s3://{self.bucket}/{self.prefix}?endpoint={self.proxy.url}"
        self.store = S3Store.from_url(self.url, retry)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def raw(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()

    def flip(self, key: str, offset: int, service_checksum: bool = True) -> None:
        head = self.client.head_object(Bucket=self.bucket, Key=self._k(key))
        data = bytearray(self.raw(key))
        data[offset] ^= 0xFF
        extra = {"ChecksumAlgorithm": "SHA256"} if service_checksum else {}
        # baton's metadata (its claim about the bytes) survives; the bytes do not.
        self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=bytes(data), Metadata=head["Metadata"],
                               **extra)

    def remove(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._k(key))


class HubBackend(ProxiedBackend):
    kind = "hub"

    def __init__(self, hub, retry: RetryPolicy, name: str = ""):
        from baton.store.hub import HubStore

        self.hub = hub
        self.repo = f"baton-test/r-{uuid.uuid4().hex[:12]}"
        hub.create_repo(self.repo)
        self.proxy = FaultyProxy(hub.url).start()
        self.store = HubStore.from_url(f"hf://{self.repo}", retry, endpoint=self.proxy.url, token=hub.token)

    def raw(self, key: str) -> bytes:
        return self.hub.read(self.repo, key)

    def flip(self, key: str, offset: int, service_checksum: bool = True) -> None:
        self.hub.corrupt(self.repo, key, offset, rehash=service_checksum)

    def remove(self, key: str) -> None:
        self.hub.remove(self.repo, key)
