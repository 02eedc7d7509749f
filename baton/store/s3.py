"""S3-compatible object stores (AWS S3, Cloudflare R2, MinIO, Backblaze B2, GCS interoperability) via boto3.

``s3://bucket/prefix`` with an optional ``?endpoint=https://host`` (else AWS_ENDPOINT_URL_S3 /
AWS_ENDPOINT_URL, else AWS itself) and ``&region=``. Credentials come only from boto3's own chain
(environment, ~/.aws, instance roles); a URL carrying credentials is refused, and every message this
module produces is scrubbed of the resolved keys.

What S3 lists as an object's sha256: S3 keeps no sha256 of its own for every object, so baton writes the
file's sha256 as user metadata ``x-amz-meta-sha256`` and also sends it as ``x-amz-checksum-sha256``,
which AWS, MinIO and R2 check against the body (a mismatch is refused as BadDigest). Some compatible
servers store that header without checking it, so neither is trusted alone: when the service returns a
full-object SHA-256 of its own that disagrees with the metadata, the listing reports the service's value
(and verification fails); the ranged read-backs compare real bytes either way.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import os
import re
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.exceptions as bx
import botocore.session
from botocore.config import Config

from ..errors import ConfigError, StoreError, WriteConflict
from ..guard import shown, split_url
from .base import ObjectInfo, RangeRead, Versioned, decode_text, safe_key, store_age, write_download
from .retry import RetryPolicy, Transient, call, unresolved_error

MULTIPART_THRESHOLD = 1 << 30  # single PUTs stop at 5 GiB; parts also make a retry cheaper
PART_SIZE = 128 << 20
META_KEY = "sha256"
TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling",
                   "ThrottlingException", "BadDigest", "XAmzContentSHA256Mismatch",
                   "IncompleteBody", "OperationAborted"}
# A conditional write that lost: 412 when the object is not at the named version (or exists, for a create), 409
# when another conditional write to the key was in progress at the same moment.
CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "TokenRefreshRequired",
              "AuthorizationHeaderMalformed", "InvalidSecurity"}


_LOADER = None  # botocore's parsed service models, shared: building a client otherwise re-reads them (~0.2 s)


def _session() -> boto3.session.Session:
    """A fresh session (credentials resolved anew) over the shared model loader."""
    global _LOADER
    core = botocore.session.get_session()
    if _LOADER is None:
        _LOADER = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _LOADER)
    return boto3.session.Session(botocore_session=core)


def _b64_to_hex(value: str) -> str | None:
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return None
    return raw.hex() if len(raw) == 32 else None


class S3Store:
    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None, region: str | None = None,
                 retry: RetryPolicy | None = None, send_checksum: bool = True):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = endpoint
        self.retry = retry or RetryPolicy()
        self.send_checksum = send_checksum
        self._reached = False  # whether the server has answered a call of this client yet
        self.multipart_threshold = MULTIPART_THRESHOLD
        self.part_size = PART_SIZE
        try:
            self._connect(endpoint, region)
        except (bx.ProfileNotFound, bx.ConfigParseError, bx.ConfigNotFound, bx.InvalidConfigError) as e:
            # ~/.aws's files and AWS_PROFILE: read when the client is made, so a bad one is said here, in one line.
            raise StoreError(f"the AWS configuration could not be used ({e}): check AWS_PROFILE, "
                             "AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE and ~/.aws/credentials") from None

    def _connect(self, endpoint: str | None, region: str | None) -> None:
        session = _session()
        region = region or session.region_name or "us-east-1"
        config = Config(
            retries={"total_max_attempts": 1},  # retrying is ours: bounded, classified, logged
            connect_timeout=min(10.0, self.retry.request_timeout), read_timeout=self.retry.request_timeout,
            # Custom endpoints (MinIO, R2, a test server) want path-style addressing.
            s3={"addressing_style": "path" if endpoint else "auto"},
            # No CRC trailers or aws-chunked bodies: several compatible servers reject them. We send our own
            # SHA-256 header instead.
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
        )
        self.client = session.client("s3", endpoint_url=endpoint, region_name=region, config=config)
        creds = session.get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        self._secrets = [s for s in (getattr(frozen, "access_key", None), getattr(frozen, "secret_key", None),
                                     getattr(frozen, "token", None)) if s and len(s) >= 8]

    @classmethod
    def from_url(cls, url: str, retry: RetryPolicy | None = None) -> S3Store:
        parts = split_url(url, "store.url")
        if parts.username or parts.password or "@" in parts.netloc:
            raise ConfigError("store.url must not carry credentials; set AWS_ACCESS_KEY_ID / "
                              "AWS_SECRET_ACCESS_KEY or a profile in ~/.aws instead")
        if not parts.netloc:
            raise ConfigError(f"store.url {url.split('?')[0]!r} names no bucket (use s3://bucket/prefix)")
        # botocore's own rule, checked here so a bad name is a config error and not a failure at the first request
        if not re.fullmatch(r"[a-zA-Z0-9.\-_]{1,255}", parts.netloc):
            raise ConfigError(f"store.url names bucket {parts.netloc!r}, not a valid bucket name (letters, digits, "
                              "'.', '-' and '_' only)")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = sorted(set(query) - {"endpoint", "region", "checksum"})
        if unknown:
            raise ConfigError(f"store.url has unknown option(s) {', '.join(unknown)} (known: endpoint, region, "
                              "checksum)")
        endpoint = query.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            ep = split_url(endpoint, "the S3 endpoint", "use http(s)://host:port")
            # Credentials first, and never echoed: whatever comes before an @ may be a key and its secret.
            if "@" in endpoint:
                raise ConfigError("the S3 endpoint must not carry credentials (it holds an '@'; the endpoint is not "
                                  "shown); use AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile in ~/.aws")
            if ep.scheme not in ("http", "https") or not ep.hostname:
                raise ConfigError(f"S3 endpoint {shown(endpoint)} is not an http(s) URL (use http(s)://host:port)")
        checksum = query.get("checksum", "sha256").lower()
        if checksum not in ("sha256", "on", "1", "true", "off", "0", "false", "none"):
            raise ConfigError(f"store.url checksum={query['checksum']!r}: use checksum=off to stop sending "
                              "x-amz-checksum-sha256, or leave it out (sha256, the default)")
        send = checksum not in ("off", "0", "false", "none")
        return cls(parts.netloc, parts.path, endpoint or None, query.get("region"), retry, send)

    # ---------------------------------------------------------------------------------- helpers
    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"S3 store {where}" + (f" (endpoint {self.endpoint})" if self.endpoint else "")

    def _key(self, key: str) -> str:
        safe_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _classify(self, e: Exception) -> Exception:
        endpoint = self.client.meta.endpoint_url
        unresolved = unresolved_error(e, self._reached, urlsplit(endpoint).hostname or endpoint)
        if unresolved is not None:
            return unresolved
        if isinstance(e, bx.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in CONFLICT_CODES or status == 412:
                return WriteConflict(f"another writer got there first (HTTP {status} {code})")
            if code in TRANSIENT_CODES or status == 429 or status >= 500:
                return Transient(f"HTTP {status} {code}".strip())
            if code == "RequestTimeTooSkewed":
                # Signed with this machine's clock, which the server finds more than 15 minutes off: every retry
                # is signed with the same clock (botocore's own correction is a retry, and retrying is ours).
                return StoreError(f"the S3 server refused the request as signed at the wrong time (HTTP {status} "
                                  f"{code}): this machine's clock is off by more than 15 minutes; set it right "
                                  "(NTP: timedatectl set-ntp true, or the VM's time sync), then rerun")
            if code == "NoSuchBucket":
                return StoreError(f"bucket {self.bucket!r} does not exist (check the bucket name in store.url, "
                                  "the endpoint and the region)")
            if code in AUTH_CODES or status == 401:
                return StoreError(f"the S3 credentials were rejected (HTTP {status} {code}): check "
                                  "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials")
            if code == "AccessDenied" or status == 403:
                return StoreError(f"access denied (HTTP {status}): check that the credentials may read, write and "
                                  f"delete in s3://{self.bucket}/{self.prefix}")
            return StoreError(self._scrub(f"HTTP {status} {code}: {err.get('Message', '')}".strip()))
        if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError)):
            return StoreError("no usable S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                              "AWS_PROFILE / ~/.aws/credentials")
        if isinstance(e, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError, ConnectionError,
                          TimeoutError, OSError)):
            return Transient(self._scrub(f"{type(e).__name__}: {e}"))
        return e

    def _call(self, fn, what: str):
        out = call(fn, what, self.describe(), self._classify, self.retry)
        self._reached = True  # the server has answered: its name resolves
        return out

    def _put_args(self, sha256: str) -> dict:
        args: dict[str, object] = {"Metadata": {META_KEY: sha256}}
        if self.send_checksum:
            args["ChecksumSHA256"] = base64.b64encode(bytes.fromhex(sha256)).decode()
        return args

    # ------------------------------------------------------------------------------- protocol
    def put_file(self, local: Path, key: str, sha256: str, create: bool = False) -> str:
        size = local.stat().st_size
        cond = {"IfNoneMatch": "*"} if create else {}
        try:
            if size > self.multipart_threshold:
                self._put_multipart(local, key, sha256, size, cond)
                return sha256

            def put() -> None:
                with open(local, "rb") as f:
                    self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=f, ContentLength=size,
                                           **self._put_args(sha256), **cond)

            self._call(put, f"upload of {key}")
        except WriteConflict:
            # The key exists: our own upload whose answer was lost (then retried), or another writer's bytes.
            head = self._call(lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key)), f"head of {key}")
            if (head.get("Metadata") or {}).get(META_KEY) != sha256 or int(head.get("ContentLength", -1)) != size:
                raise WriteConflict(f"{key} in {self.describe()} already holds other bytes (written by another "
                                    "session, or left by an interrupted one); it is not overwritten") from None
        return sha256

    def _put_multipart(self, local: Path, key: str, sha256: str, size: int, cond: dict | None = None) -> None:
        import hashlib

        k = self._key(key)
        part_size = max(self.part_size, -(-size // 9000))  # S3 allows at most 10,000 parts
        extra = {"ChecksumAlgorithm": "SHA256"} if self.send_checksum else {}
        upload = self._call(lambda: self.client.create_multipart_upload(
            Bucket=self.bucket, Key=k, Metadata={META_KEY: sha256}, **extra), f"multipart start of {key}")
        uid = upload["UploadId"]
        parts = []
        try:
            with open(local, "rb") as f:
                for n, offset in enumerate(range(0, size, part_size), start=1):
                    f.seek(offset)
                    data = f.read(part_size)
                    args = {}
                    if self.send_checksum:
                        args["ChecksumSHA256"] = base64.b64encode(hashlib.sha256(data).digest()).decode()
                    r = self._call(lambda: self.client.upload_part(Bucket=self.bucket, Key=k, UploadId=uid,
                                                                   PartNumber=n, Body=data, **args),
                                   f"upload of {key} part {n}")
                    parts.append({"PartNumber": n, "ETag": r["ETag"], **args})
            self._call(lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=k, UploadId=uid, MultipartUpload={"Parts": parts}, **(cond or {})),
                f"multipart completion of {key}")
        except BaseException:
            try:  # an abandoned upload costs storage until a lifecycle rule removes it
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=uid)
            except Exception:  # noqa: BLE001 - the original failure is the one to report
                pass
            raise

    def list(self, prefix: str, checksums: bool = True) -> dict[str, ObjectInfo]:
        full = self._key(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        if prefix.endswith("/") and not full.endswith("/"):
            full += "/"
        cut = len(self.prefix) + 1 if self.prefix else 0

        def scan() -> list[tuple[str, int]]:
            found = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    found.append((obj["Key"], int(obj["Size"])))
            return found

        out: dict[str, ObjectInfo] = {}
        for full_key, size in self._call(scan, f"listing of {prefix or '/'}"):
            key = full_key[cut:]
            if not checksums:
                out[key] = ObjectInfo(key, size, None)
                continue
            head = self._call(lambda: self.client.head_object(Bucket=self.bucket, Key=full_key,
                                                              ChecksumMode="ENABLED"), f"head of {key}")
            meta = (head.get("Metadata") or {}).get(META_KEY)
            service = head.get("ChecksumSHA256")
            # Only a checksum of the whole object compares with a file's sha256; a multipart upload's is a
            # checksum of the parts' checksums ("...-N", ChecksumType COMPOSITE, an ETag ending in "-N").
            multipart = "-" in str(head.get("ETag", "")).strip('"')
            whole = head.get("ChecksumType") == "FULL_OBJECT" or (head.get("ChecksumType") is None and not multipart)
            sha: str | None
            service_hex = _b64_to_hex(service) if service and "-" not in service and whole else None
            if service_hex and meta and service_hex != meta:
                sha, source = service_hex, "service x-amz-checksum-sha256, which differs from x-amz-meta-sha256"
            elif service_hex and meta:
                sha, source = meta, "x-amz-meta-sha256, equal to the service's x-amz-checksum-sha256"
            elif meta:
                sha, source = meta, "x-amz-meta-sha256 written by baton (the service keeps no full-object sha256)"
            else:
                sha, source = service_hex, "service x-amz-checksum-sha256" if service_hex else ""
            out[key] = ObjectInfo(key, int(head.get("ContentLength", size)), sha, source)
        return out

    def read_range(self, key: str, start: int, end: int) -> RangeRead:
        def read() -> RangeRead:
            try:
                r = self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end}")
            except bx.ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    raise StoreError(f"{key} not found in {self.describe()}") from None
                raise
            data = r["Body"].read()
            return RangeRead(data, int(r["ResponseMetadata"]["HTTPStatusCode"]), r.get("ContentRange"))

        return self._call(read, f"ranged read of {key}")

    def get_file(self, key: str, local: Path) -> None:
        def get() -> None:
            try:
                r = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except bx.ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    raise StoreError(f"{key} not found in {self.describe()}") from None
                raise
            write_download(local, r["Body"].iter_chunks(8 << 20))

        self._call(get, f"download of {key}")

    def delete(self, key: str) -> None:
        self._call(lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)), f"delete of {key}")

    def delete_many(self, keys: builtins.list[str]) -> None:  # `list` here is the method
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            try:
                r = self._call(lambda: self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk}),
                               f"delete of {len(chunk)} objects")
            except StoreError:
                # Some compatible services (GCS's XML API) have no multi-object delete: one by one then.
                for k in keys[i : i + 1000]:
                    self.delete(k)
                continue
            if r.get("Errors"):
                e = r["Errors"][0]
                raise StoreError(f"could not delete {e.get('Key')} in {self.describe()}: {e.get('Code')}")

    def read_text(self, key: str) -> str | None:
        def read() -> bytes | None:
            try:
                r = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except bx.ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            return r["Body"].read()

        return decode_text(self._call(read, f"read of {key}"), key, self.describe())

    def write_text(self, key: str, text: str) -> None:
        import hashlib

        data = text.encode("utf-8")
        args = self._put_args(hashlib.sha256(data).hexdigest())
        self._call(lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **args),
                   f"write of {key}")

    # ------------------------------------------------------------------------ conditional writes
    def read_versioned(self, key: str) -> Versioned | None:
        """The object, its ETag as the version, and its age by S3's clock: the answer's Date less the object's
        Last-Modified (both stamped by the service, to the second)."""
        def read() -> Versioned | None:
            try:
                r = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except bx.ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            text = decode_text(r["Body"].read(), key, self.describe())
            assert text is not None
            date = (r.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get("date")
            modified = r.get("LastModified")
            age = None
            if date and "GMT," in date:  # a proxy on the way added its Date beside the service's: one clock's is enough
                date = date.split("GMT,", 1)[0] + "GMT"
            if date and modified is not None:
                try:
                    age = store_age(parsedate_to_datetime(date).timestamp(), modified.timestamp())
                except (TypeError, ValueError):
                    age = None
            return Versioned(text, str(r["ETag"]), age)

        return self._call(read, f"read of {key}")

    def write_if(self, key: str, text: str, version: str | None) -> str:
        """PutObject with If-None-Match: * (create) or If-Match: <ETag> (replace): S3 refuses the loser with 412
        (or 409 while another conditional write of the key is in flight)."""
        data = text.encode("utf-8")
        args = self._put_args(hashlib.sha256(data).hexdigest())
        cond = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            r = self._call(lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                                          **args, **cond), f"conditional write of {key}")
            return str(r["ETag"])
        except WriteConflict:
            now = self.read_versioned(key)
            if now is not None and now.text == text:
                return now.version  # our own write, retried after its answer was lost
            raise WriteConflict(f"{key} in {self.describe()} was changed by another writer") from None
