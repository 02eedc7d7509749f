"""A pre-imported launcher for the `baton` command, so a test can start (and kill) dozens of processes.

Importing torch and transformers takes seconds on a small machine; the reliability tests start a process
per kill. The zygote imports baton once, then forks one child per request; each child runs the real
``baton.cli.main`` in its own process with its own pid, environment, working folder and output file, and
ends exactly like ``python -m baton.cli`` would: the CLI's exit status, or status 1 and a traceback on
stderr for an exception that escapes. Tests kill the children with real signals.

Protocol (JSON lines on stdin/stdout):
  {"op": "spawn", "argv": [...], "env": {...}, "cwd": "...", "out": "stdout file", "err": "stderr file",
   "replace_env": false (true: env is the child's whole environment)}
      -> {"pid": N}
  {"op": "wait", "pid": N, "timeout": seconds}  -> {"status": rc or -signal, or null on timeout}
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _child(req: dict) -> None:
    rc = 1
    try:
        os.setsid()  # its own process group: a test may kill it without touching the zygote
        os.chdir(req.get("cwd") or ROOT)
        if req.get("replace_env"):  # the caller's whole environment, not the zygote's plus changes
            os.environ.clear()
        os.environ.update(req.get("env") or {})
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, req["out"]), (2, req["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(s, signal.SIG_DFL)
        sys.argv = ["baton", *req["argv"]]
        from baton.cli import main

        code = main(req["argv"])
        rc = 0 if code is None else int(code)
    except SystemExit as e:  # argparse exits 2 this way, as it would in a fresh interpreter
        code = e.code
        if code is None:
            rc = 0
        elif isinstance(code, int):
            rc = code
        else:
            print(code, file=sys.stderr)
            rc = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def serve() -> None:
    # Import everything a training run needs, but compute nothing: no thread pools exist at fork time.
    import transformers.models.llama.modeling_llama  # noqa: F401

    import baton.checkpoint.cycle  # noqa: F401
    import baton.cli  # noqa: F401
    import baton.loop  # noqa: F401
    import baton.model.export  # noqa: F401

    try:
        import boto3  # noqa: F401
        import botocore.session  # noqa: F401

        import baton.store.s3  # noqa: F401
    except ImportError:
        pass
    reaped: dict[int, int] = {}
    out = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(req)
            print(json.dumps({"pid": pid}), file=out, flush=True)
        elif req["op"] == "wait":
            pid, deadline = req["pid"], time.monotonic() + req.get("timeout", 600)
            status = reaped.pop(pid, None)
            while status is None:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = os.waitstatus_to_exitcode(st)
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            print(json.dumps({"status": status}), file=out, flush=True)


class Zygote:
    """Client side: start the server, spawn `baton` children, wait for them."""

    def __init__(self, env: dict | None = None, unset: tuple[str, ...] = ()):
        full = {k: v for k, v in os.environ.items() if k not in unset}
        full.update({"PYTHONUNBUFFERED": "1", **(env or {})})
        self.env = full
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=full, cwd=ROOT)
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError("the zygote did not start")
        self.count = 0

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the zygote died")
        return json.loads(line)

    def spawn(self, argv: list[str], out_dir: Path, env: dict | None = None, cwd: Path | None = None,
              replace_env: bool = False) -> Child:
        self.count += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        out, err = out_dir / f"p{self.count:03d}.out", out_dir / f"p{self.count:03d}.err"
        pid = self._ask({"op": "spawn", "argv": [str(a) for a in argv], "env": env or {}, "cwd": str(cwd or ROOT),
                         "out": str(out), "err": str(err), "replace_env": replace_env})["pid"]
        return Child(self, pid, out, err)

    def run(self, argv: list[str], out_dir: Path, env: dict | None = None, timeout: float = 300,
            cwd: Path | None = None, replace_env: bool = False) -> Result:
        return self.spawn(argv, out_dir, env, cwd, replace_env).wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:  # it holds no state worth a slow interpreter shutdown
                self.proc.kill()
                self.proc.wait()


class Result:
    def __init__(self, status: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = status, stdout, stderr


class Child:
    """A `baton` process forked from the zygote: a real process with its own pid and session, signalled with real
    signals; its stdout and stderr go to files (``stderr_text()`` reads what it wrote so far)."""

    def __init__(self, zygote: Zygote, pid: int, out: Path, err: Path):
        self.zygote, self.pid, self.out, self.err = zygote, pid, out, err
        self.status: int | None = None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    send_signal = kill

    def alive(self) -> bool:
        if self.status is not None:
            return False
        st = self.zygote._ask({"op": "wait", "pid": self.pid, "timeout": 0})["status"]
        if st is not None:
            self.status = st
        return self.status is None

    def poll(self) -> int | None:
        """The exit status (negative: the signal), or None while it runs, as ``Popen.poll``."""
        return None if self.alive() else self.status

    def wait(self, timeout: float = 300) -> Result:
        if self.status is None:
            st = self.zygote._ask({"op": "wait", "pid": self.pid, "timeout": timeout})["status"]
            if st is None:
                self.kill()
                self.zygote._ask({"op": "wait", "pid": self.pid, "timeout": 30})
                raise TimeoutError(f"baton child {self.pid} ran past {timeout}s:\n{self.stderr_text()[-3000:]}")
            self.status = st
        return Result(self.status, self.out.read_text(errors="replace"), self.stderr_text())

    def stderr_text(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""


class FreshChild(Child):
    """The same handle over a new interpreter (``python -m baton.cli``), for what only a fresh start shows: the
    entry point itself, a clock that starts before Python imports anything, a hash seed of its own."""

    def __init__(self, argv: list[str], out: Path, err: Path, env: dict, cwd: Path):
        with open(out, "w") as o, open(err, "w") as e:
            self.proc = subprocess.Popen([sys.executable, "-m", "baton.cli", *map(str, argv)], cwd=cwd, env=env,
                                         stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
        self.pid, self.out, self.err = self.proc.pid, out, err
        self.status = None

    def alive(self) -> bool:
        if self.status is None:
            self.status = self.proc.poll()
        return self.status is None

    def wait(self, timeout: float = 300) -> Result:
        try:
            self.status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(30)
            raise TimeoutError(f"baton child {self.pid} ran past {timeout}s:\n{self.stderr_text()[-3000:]}") from None
        return Result(self.status, self.out.read_text(errors="replace"), self.stderr_text())


if __name__ == "__main__":
    serve()
