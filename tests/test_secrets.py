"""Credentials in URLs are never stored or printed, and the storage clients' loggers stay quiet."""

from __future__ import annotations

import json
import logging
import socket
import traceback
from pathlib import Path

import pytest

from convert_helpers import run_cli
from lerobot_shards.convert.destination import RUN_RECORD
from lerobot_shards.convert.run import _source_url, convert_dataset
from lerobot_shards.exceptions import LeRobotShardsError
from lerobot_shards.format import MANIFEST_NAME
from lerobot_shards.loader import EpisodePoolDataset, Mixture, MixtureDataset, MixtureSource
from lerobot_shards.redaction import NOISY_LOGGERS, quiet_storage_loggers, redact, without_credentials

TOKEN = "s3cr3t-t0ken"


def test_a_url_loses_its_credentials_and_they_become_secrets() -> None:
    assert without_credentials(f"http://user:{TOKEN}@host:8080/ds?x=1") == "http://host:8080/ds?x=1"
    assert redact(f"failed: {TOKEN}") == "failed: ***"  # registered by the call above
    assert redact("GET https://alice:hunter22@example.org/ds") == "GET https://***@example.org/ds"
    assert _source_url(f"http://user:{TOKEN}@host/ds") == "http://host/ds"  # what convert.json and manifest store
    assert without_credentials("/local/path@2") == "/local/path@2"


def test_no_credentials_in_convert_outputs_or_errors(synth_factory, tmp_path: Path) -> None:
    raw = synth_factory(num_episodes=2, length_range=(6, 8), cameras=("observation.images.front",))
    out = tmp_path / "out"
    convert_dataset(raw, out, progress=False)
    stored = (out / MANIFEST_NAME).read_text() + (out / RUN_RECORD).read_text()
    assert json.loads((out / MANIFEST_NAME).read_text())["converter"]["arguments"]["source"] == str(raw)
    with socket.socket() as s:  # a port nobody listens on: the source cannot be read
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://user:{TOKEN}@127.0.0.1:{port}/ds"
    commands = (
        ["convert", url, tmp_path / "out2", "--no-progress"],
        ["inspect", url],
        ["verify", out, "--source", url],
    )
    for args in commands:
        result = run_cli("-vv", *args)  # tracebacks included
        assert result.returncode == 1, result.stderr
        assert TOKEN not in result.stdout + result.stderr, (args, result.stderr[-2000:])
        assert "user:" not in result.stdout + result.stderr, (args, result.stderr[-2000:])
    assert TOKEN not in stored and not (tmp_path / "out2" / RUN_RECORD).exists()


def test_storage_loggers_stay_quiet_at_debug(s3_server, tmp_path: Path, caplog) -> None:
    """A training script at logging.DEBUG: after quiet_storage_loggers, botocore logs no request
    (its DEBUG lines carry the access key id and the endpoint)."""
    caplog.set_level(logging.DEBUG)
    quiet_storage_loggers()
    assert all(logging.getLogger(name).getEffectiveLevel() >= logging.WARNING for name in NOISY_LOGGERS)
    fs = s3_server.filesystem()
    fs.mkdir("quiet-logs")
    fs.pipe_file("quiet-logs/x", b"data")
    assert fs.cat_file("quiet-logs/x") == b"data"
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert s3_server.storage_options["key"] not in text and s3_server.endpoint_url not in text
    assert not [r for r in caplog.records if r.name.split(".")[0] in NOISY_LOGGERS and r.levelno < logging.WARNING]


def test_no_credentials_in_python_api_errors(synth_factory, tmp_path: Path) -> None:
    """The Python API's errors hide a URL's password as the CLI's do: in the message and the whole
    traceback, whichever type carries it (ours, or a FileNotFoundError passed through)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = "api-pa55word-never-registered"
    url = f"http://user:{password}@127.0.0.1:{port}/ds"
    calls = (
        lambda: EpisodePoolDataset(url),
        lambda: MixtureDataset(Mixture([MixtureSource(url, weight=1)])),
        lambda: convert_dataset(url, tmp_path / "out", progress=False),
    )
    for call in calls:
        with pytest.raises(Exception) as raised:  # noqa: PT011  (what matters is the text, of any type)
            call()
        text = "".join(traceback.format_exception(raised.value))
        assert password not in text and "127.0.0.1" in text, text
    assert password not in str(LeRobotShardsError(f"cannot read {url}"))
