"""A real S3-protocol server (moto_server) on 127.0.0.1 for bucket tests, one per session.

Registered from conftest.py via ``pytest_plugins``. Tests get an endpoint URL and the
storage_options that point s3fs at it; each test makes its own bucket. A test that kills its
server starts its own with ``moto_server``.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

STARTUP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for subprocesses (the CLI) using the server
    log: Path | None = None  # the server's request log

    def requests(self, method: str, key: str) -> int:
        """How many ``method`` requests for ``key`` (``bucket/path``) the server has logged so far."""
        assert self.log is not None
        pattern = rf'"(?:\x1b\[[\d;]*m)*{method} /{re.escape(key)}(\?[^ "]*)? HTTP'  # werkzeug may colour it
        return len(re.findall(pattern, self.log.read_text(errors="replace")))

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on {url} within {STARTUP_TIMEOUT_S:.0f} s")


@contextlib.contextmanager
def moto_server(log_dir: Path) -> Iterator[tuple[S3Server, subprocess.Popen]]:
    """A ``moto_server`` process on a free local port, killed on exit; tests that kill it early get the process."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_dir / "moto_server.log"
    exe = Path(sys.executable).with_name("moto_server")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    try:
        _wait_until_up(url, proc, log)
        server = S3Server(
            endpoint_url=url,
            storage_options={
                "key": env["AWS_ACCESS_KEY_ID"],
                "secret": env["AWS_SECRET_ACCESS_KEY"],
                "client_kwargs": {"endpoint_url": url},
            },
            env={**env, "AWS_ENDPOINT_URL": url},
            log=log,
        )
        yield server, proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's server (each test makes its own bucket); killed when the session ends."""
    with moto_server(tmp_path_factory.mktemp("moto")) as (server, _):
        yield server
