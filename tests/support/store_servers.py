"""Real servers for the store tests: moto's standalone S3 server in a subprocess, and a faulty HTTP proxy.

The proxy sits between a real client and a real server and misbehaves on demand, the way broken or
overloaded S3-compatible services and CDNs have: it ignores ``Range``, serves the right length from the
wrong offset, drops connections mid-upload, answers 503, or slows uploads down. Nothing in the client is
patched: it talks HTTP to 127.0.0.1 like it would to any endpoint.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# The moto server in its own process, bound to a port of the kernel's choice (port 0), which it prints:
# no port is picked first and bound later, so no other process can take it in between.
MOTO_MAIN = """
import os, threading
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing more to say; no pipe to fill
threading.Event().wait()
"""


def wait_http(url: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no server answered at {url} within {timeout}s")


class MotoServer:
    """The moto S3 server on 127.0.0.1, in its own process, on the port the kernel gave it."""

    def __init__(self) -> None:
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> MotoServer:
        self.proc = subprocess.Popen([sys.executable, "-c", MOTO_MAIN], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the moto server did not start (exit status {self.proc.poll()})")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_http(self.url + "/moto-api/", proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LocalHTTPServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 that hands every request, whatever its method, to ``handle``;
    the base of the test servers here (the proxy, the Hub)."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                owner.handle(self)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def start(self):
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def read_chunked(h: BaseHTTPRequestHandler) -> bytes:
    """A request body sent with ``Transfer-Encoding: chunked``, trailers skipped."""
    parts = []
    while True:
        size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(parts)
        parts.append(h.rfile.read(size))
        h.rfile.readline()


HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class Fault:
    """What the proxy does to requests that ``match`` (method, path); ``times`` None means every time."""

    kind: str  # ignore_range | shift_range | lie_range | drop | status | slow | stall | lose_answer
    match: Callable[[str, str], bool] = lambda method, path: True
    times: int | None = None
    status: int = 503
    code: str = ""  # status: the S3 error code answered (default: SlowDown for 429, else ServiceUnavailable)
    shift: int = 4096
    slow_seconds_per_mb: float = 0.0
    stall_seconds: float = 60.0  # stall: say nothing this long (or until clear()), then answer normally
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)


@dataclass
class Seen:
    method: str
    path: str
    status: int | None = None
    faulted: str | None = None
    at: float = field(default_factory=time.monotonic)


class FaultyProxy(LocalHTTPServer):
    """A threaded HTTP/1.1 reverse proxy to ``upstream`` with switchable faults."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = urlsplit(upstream)
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self.lock = threading.Lock()

    def add(self, fault: Fault) -> Fault:
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self.lock:
            for f in self.faults:
                f.released.set()
            self.faults.clear()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.match(method, path) and (f.times is None or f.hits < f.times):
                    f.hits += 1
                    return f
        return None

    # ------------------------------------------------------------------------------ forwarding
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        method, path = h.command, h.path
        seen = Seen(method, path)
        with self.lock:
            self.seen.append(seen)
        fault = self._fault_for(method, path)
        seen.faulted = fault.kind if fault else None
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP}
        if fault is not None and fault.kind == "drop":
            # Take part of the body, then vanish: the client sees a reset mid-upload.
            length = int(h.headers.get("Content-Length") or 0)
            if length:
                h.rfile.read(min(length, 1 << 16))
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        body = self._read_body(h, fault)
        if body is None:  # the client went away mid-body: forward nothing, as a real server would
            h.close_connection = True
            return
        if fault is not None and fault.kind == "stall":
            # A server that took the request and went quiet; a client without a timeout waits all along.
            fault.released.wait(fault.stall_seconds)
        if fault is not None and fault.kind == "status":
            payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                       f"{fault.code or ('SlowDown' if fault.status == 429 else 'ServiceUnavailable')}</Code>"
                       f"<Message>injected by the test proxy</Message></Error>").encode()
            seen.status = fault.status
            self._reply(h, fault.status, [("Content-Type", "application/xml")], payload)
            return
        if fault is not None and fault.kind in ("ignore_range", "shift_range", "lie_range"):
            rng = next((k for k in headers if k.lower() == "range"), None)
            if rng is not None and fault.kind == "ignore_range":
                del headers[rng]
            elif rng is not None:
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", headers[rng])
                if m:
                    a, b = int(m.group(1)), int(m.group(2))
                    k = fault.shift if a >= fault.shift else -fault.shift
                    if a + k < 0:
                        k = fault.shift
                    headers[rng] = f"bytes={a + k}-{b + k}"
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            conn.request(method, path, body=body if body or method in ("PUT", "POST") else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP | {"content-length"}]
            if method == "HEAD" and resp.getheader("Content-Length") is not None:
                out_headers.append(("Content-Length", resp.getheader("Content-Length")))
            status = resp.status
        finally:
            conn.close()
        if fault is not None and fault.kind == "lie_range" and status == 206:
            # Bytes from the wrong offset under a Content-Range that claims the requested one.
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", h.headers.get("Range", ""))
            total = next((v.rsplit("/", 1)[1] for k, v in out_headers if k.lower() == "content-range"), "*")
            if m:
                out_headers = [(k, v) for k, v in out_headers if k.lower() != "content-range"]
                out_headers.append(("Content-Range", f"bytes {m.group(1)}-{m.group(2)}/{total}"))
        seen.status = status
        if fault is not None and fault.kind == "lose_answer":
            # The server did the work (a write landed), then the answer never reached the client: it retries.
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self._reply(h, status, out_headers, data, head=method == "HEAD")

    def _read_body(self, h: BaseHTTPRequestHandler, fault: Fault | None) -> bytes | None:
        slow = fault.slow_seconds_per_mb if fault is not None and fault.kind == "slow" else 0.0
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return read_chunked(h)
        length = int(h.headers.get("Content-Length") or 0)
        chunks, left = [], length
        while left:
            try:
                c = h.rfile.read(min(left, 1 << 16) if slow else left)
            except OSError:
                return None
            if not c:
                return None
            chunks.append(c)
            left -= len(c)
            if slow:
                time.sleep(slow * len(c) / (1 << 20))
        return b"".join(chunks)

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], data: bytes,
               head: bool = False) -> None:
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        if head:
            # A HEAD answer carries the object's length, not ours.
            if not any(k.lower() == "content-length" for k, _ in headers):
                h.send_header("Content-Length", "0")
            h.end_headers()
            return
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
