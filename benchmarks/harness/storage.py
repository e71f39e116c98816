"""The benchmark's bucket: the real S3-protocol server (moto_server) on 127.0.0.1 behind our shaper.

Data is uploaded straight to the server (setup is not shaped); cases read through the shaper.
Credentials are moto's fixed test values and go to cases as fsspec ``storage_options``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from .shaper import Profile, ShapedProxy

BUCKET = "bench"
KEYS = {"key": "testing", "secret": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(url: str) -> dict[str, Any]:
    return {**KEYS, "client_kwargs": {"endpoint_url": url}}


class Bucket:
    """moto_server + ``ShapedProxy``; ``storage_options`` point s3fs at the shaped side."""

    def __init__(self, profile: Profile, log_dir: Path) -> None:
        self.profile = profile
        self.port = _free_port()
        self.direct_url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("moto_server")
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = log_dir / "moto_server.log"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        with open(self._log, "wb") as out:
            self._proc = subprocess.Popen(
                [str(exe), "-H", "127.0.0.1", "-p", str(self.port)], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        self._wait_until_up()
        self.proxy = ShapedProxy(("127.0.0.1", self.port), profile).start()
        self.storage_options = _options(self.proxy.url)
        self._direct().mkdir(BUCKET)

    def _wait_until_up(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self._proc.returncode}: {self._log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.direct_url, timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto_server did not answer on {self.direct_url} within {timeout:.0f} s")

    def _direct(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **_options(self.direct_url))

    def upload(self, local: Path, prefix: str) -> str:
        """Copy the tree ``local`` to ``s3://bench/<prefix>`` (unshaped) and return that URL."""
        url = f"{BUCKET}/{prefix}"
        fs = self._direct()
        files = [p for p in sorted(local.rglob("*")) if p.is_file()]
        fs.put([str(p) for p in files], [f"{url}/{p.relative_to(local).as_posix()}" for p in files])
        return f"s3://{url}"

    def close(self) -> None:
        self.proxy.stop()
        self._proc.kill()
        self._proc.wait(timeout=10)

    def __enter__(self) -> Bucket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
