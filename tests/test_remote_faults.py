"""An unresponsive bucket gives a clear error naming the shard within the read timeout, instead of
a stall of minutes. The server is a moto process of this test's own, paused with SIGSTOP (the
session-wide one stays untouched for the other tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.remote import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, with_timeouts
from lerobot_shards.loader.sources import open_source
from s3_server import _free_port, _wait_until_up

HANG_GUARD_S = 120  # only so that a regression fails instead of hanging the suite


@pytest.fixture
def own_server(tmp_path: Path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    log = tmp_path / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        _wait_until_up(url, proc, log)
        yield proc, {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": url}}
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)


def test_timeout_defaults_are_seconds_and_overridable() -> None:
    opts = with_timeouts("s3://b/ds", {"config_kwargs": {"read_timeout": 60}})
    assert opts["config_kwargs"]["read_timeout"] == 60  # the user's value wins
    assert opts["config_kwargs"]["connect_timeout"] == CONNECT_TIMEOUT_S <= 10
    assert with_timeouts("s3://b/ds", None)["config_kwargs"]["read_timeout"] == READ_TIMEOUT_S <= 10
    assert with_timeouts("/local/ds", None) is None


def test_paused_bucket_fails_naming_the_shard(own_server, synth_factory, tmp_path: Path) -> None:
    proc, opts = own_server
    raw = synth_factory(num_episodes=2, length_range=(6, 8), cameras=("observation.images.front",))
    convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("paused")
    fs.put(str(tmp_path / "out") + "/", "paused/ds", recursive=True)
    fast = {**opts, "config_kwargs": {"read_timeout": 1, "connect_timeout": 1, "retries": {"max_attempts": 0}}}
    ds = EpisodePoolDataset("s3://paused/ds", storage_options=fast, episode_pool_size=1)
    source = open_source("s3://paused/ds", storage_options=with_timeouts("s3://paused/ds", fast))
    os.kill(proc.pid, signal.SIGSTOP)
    # mid-epoch: a source that is open reads an episode
    with pytest.raises(OSError, match=r"s3://paused/ds/shards/shard-000000\.tar: episode 0: cannot read it"):
        source.read_episode(0, 0)
    source.close()
    # a new epoch: a new iterator over the paused bucket
    outcome: list[BaseException | str] = []

    def consume() -> None:
        try:
            list(ds)
            outcome.append("finished")
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert outcome, f"no error within {HANG_GUARD_S} s: reads against a paused server hang"
    error = outcome[0]
    assert isinstance(error, OSError), error
    # The iterator reuses the dataset's manifest (no fetch): its first read names the shard and episode.
    assert re.match(r"s3://paused/ds/shards/shard-\d+\.tar: episode \d+: cannot read it \(", str(error)), str(error)
    assert "Timeout" in str(error), str(error)
