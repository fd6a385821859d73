"""Runs a real `petrel run` (HTTP source -> ndjson file sink) for the tests."""

import ctypes
import json
import os
import pathlib
import signal
import socket
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def petrel_bin():
    if os.environ.get("PETREL_TEST_BIN"):
        return os.environ["PETREL_TEST_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    return os.path.join(target, "release", "petrel")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(timeout, what, check):
    deadline = time.monotonic() + timeout
    while True:
        ok, why = check()
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {why}")
        time.sleep(0.05)


def _die_with_parent():
    # PR_SET_PDEATHSIG: the agent must not outlive a killed test run.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class Agent:
    def __init__(self, tmp, port):
        self.tmp = pathlib.Path(tmp)
        self.port = port
        self.out = self.tmp / "out.ndjson"
        self.proc = None

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}/ingest"

    def start(self):
        cfg = self.tmp / "agent.yaml"
        cfg.write_text(
            "sources:\n  - type: http\n    address: 127.0.0.1:%d\n    path: /ingest\n"
            "    max_body_bytes: 16MiB\nsinks:\n  - type: file\n    path: %s\n    encoding: ndjson\n"
            % (self.port, self.out)
        )
        self.proc = subprocess.Popen(
            [petrel_bin(), "run", "--config", str(cfg), "--data-dir", str(self.tmp / "data"),
             "--api-addr", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"petrel exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True, ""
            except OSError as e:
                return False, str(e)

        wait_for(30, "the HTTP source", up)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def numbers(self):
        counts = {}
        try:
            data = self.out.read_bytes()
        except FileNotFoundError:
            return counts
        for line in data.split(b"\n"):
            if not line:
                continue
            try:
                n = int(json.loads(line)["n"])
            except (ValueError, KeyError):
                continue
            counts[n] = counts.get(n, 0) + 1
        return counts

    def wait_exactly_once(self, n, timeout=60):
        def all_there():
            c = self.numbers()
            missing = sum(1 for i in range(n) if i not in c)
            return missing == 0, f"{missing} of {n} missing"

        wait_for(timeout, "every record", all_there)
        c = self.numbers()
        dups = [k for k, v in c.items() if v > 1][:5]
        assert not dups, f"duplicates: {dups}"
        assert len(c) == n


@pytest.fixture
def agent(tmp_path):
    a = Agent(tmp_path, free_port())
    a.start()
    yield a
    a.stop()


@pytest.fixture
def down(tmp_path):
    """An agent that is not running (yet)."""
    a = Agent(tmp_path, free_port())
    yield a
    a.stop()
