"""An unresponsive bucket gives a clear error naming the shard within the read timeout, instead of
a stall of minutes. The server is a moto process of this test's own, paused with SIGSTOP (the
session-wide one stays untouched for the other tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset, ReadOptions
from lerobot_shards.loader.decoding.decoders import DecodeError
from lerobot_shards.loader.read.remote import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, with_timeouts
from lerobot_shards.loader.read.sources import open_source
from lerobot_shards.timeouts import call_deadline
from s3_server import _free_port, _wait_until_up
from waits import HANG_GUARD_S

# Shorter than the defaults, through the public storage options, so that each case takes seconds:
# every call then gives up after call_deadline = 5 s x 1 try x 2 s + 2 s = 12 s. Long enough that
# the running server's answers on a loaded 2-core machine are not mistaken for a pause (0.5 s
# timeouts were, once, while a dataset was being opened).
FAST = {"read_timeout": 2.0, "connect_timeout": 2.0, "retries": {"max_attempts": 0}}


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


def _outcome_within_guard(work: Callable[[], object]) -> BaseException | str:
    """What ``work`` raised (or "finished") when run in a thread, failing the test instead of hanging
    when it gives nothing within ``HANG_GUARD_S``."""
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            work()
            outcome.append("finished")
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert outcome, f"no error within {HANG_GUARD_S} s: reads against a paused server hang"
    return outcome[0]


def test_timeout_defaults_are_seconds_and_overridable() -> None:
    opts = with_timeouts("s3://b/ds", {"config_kwargs": {"read_timeout": 60}})
    assert opts["config_kwargs"]["read_timeout"] == 60  # the user's value wins
    assert opts["config_kwargs"]["connect_timeout"] == CONNECT_TIMEOUT_S <= 10
    assert with_timeouts("s3://b/ds", None)["config_kwargs"]["read_timeout"] == READ_TIMEOUT_S <= 10
    assert with_timeouts("/local/ds", None) is None


@pytest.mark.slow
def test_paused_bucket_fails_naming_the_shard(own_server, synth_factory, tmp_path: Path) -> None:
    proc, opts = own_server
    raw = synth_factory(num_episodes=2, length_range=(6, 8), cameras=("observation.images.front",))
    convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("paused")
    fs.put(str(tmp_path / "out") + "/", "paused/ds", recursive=True)
    fast = {**opts, "config_kwargs": FAST}
    ds = EpisodePoolDataset("s3://paused/ds", storage_options=fast, episode_pool_size=1)
    source = open_source("s3://paused/ds", ReadOptions(storage_options=fast))
    os.kill(proc.pid, signal.SIGSTOP)
    # mid-epoch: a source that is open reads an episode
    with pytest.raises(OSError, match=r"s3://paused/ds/shards/shard-000000\.tar: episode 0: cannot read it"):
        source.read_episode(0, 0)
    source.close()
    # a new epoch: a new iterator over the paused bucket
    error = _outcome_within_guard(lambda: list(ds))
    assert isinstance(error, OSError), error
    # The iterator reuses the dataset's manifest (no fetch): its first read names the shard and episode.
    assert re.match(r"s3://paused/ds/shards/shard-\d+\.tar: episode \d+: cannot read it \(", str(error)), str(error)
    assert "Timeout" in str(error), str(error)


def test_every_call_has_a_deadline_under_a_minute() -> None:
    import s3fs

    fs = s3fs.S3FileSystem(anon=True, **with_timeouts("s3://b/ds", None))
    assert call_deadline(fs) == 52.0  # 5 s3fs tries x 2 botocore tries x 5 s + the waits between tries
    fast = s3fs.S3FileSystem(anon=True, config_kwargs=FAST)
    assert call_deadline(fast) == 12.0  # 5 s3fs tries x 1 x 2 s + the waits
    assert call_deadline(fsspec.filesystem("file")) is None


def _bucket(own_server, synth_factory, tmp_path: Path) -> tuple[dict, Path, Path]:
    proc, opts = own_server
    raw = synth_factory(num_episodes=4, length_range=(6, 8), cameras=("observation.images.front",))
    out = tmp_path / "out"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=1), progress=False)
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("paused")
    fs.put(str(out) + "/", "paused/ds", recursive=True)
    fs.put(str(raw) + "/", "paused/raw", recursive=True)
    return {**opts, "config_kwargs": FAST}, raw, out


@pytest.mark.slow
def test_paused_server_every_cli_command_fails_naming_the_file(own_server, synth_factory, tmp_path: Path) -> None:
    """inspect, verify, upload and convert to the bucket, all started against a paused server (at
    once, to keep the test short): each exits 1 within the guard, naming the object it waited for."""
    proc, _ = own_server
    fast, raw, out = _bucket(own_server, synth_factory, tmp_path)
    options = ["--storage-options", json.dumps(fast)]
    commands = {
        "inspect": ["inspect", "s3://paused/ds", *options],
        "inspect raw": ["inspect", "s3://paused/raw", *options],
        "verify": ["verify", "s3://paused/ds", "--no-progress", *options],
        "upload": ["upload", str(out), "s3://paused/up", "--no-progress", *options],
        "convert": ["convert", str(raw), "s3://paused/conv", "--no-progress", *options],
    }
    os.kill(proc.pid, signal.SIGSTOP)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    running = {
        name: subprocess.Popen(
            [sys.executable, "-m", "lerobot_shards.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for name, args in commands.items()
    }
    for name, p in running.items():
        try:
            _, err = p.communicate(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"{name}: still running after {HANG_GUARD_S} s against a paused server")
        text = err.decode()
        assert p.returncode == 1, (name, text)
        assert re.search(r"s3://paused/\w+/[\w./-]+: (timed out talking to the storage endpoint|no answer)", text), (
            name,
            text,
        )
        assert "Traceback" not in text and "127.0.0.1" not in text, (name, text)


@pytest.mark.parametrize("cached", [False, True], ids=["no cache", "cache_dir"])
def test_paused_server_raw_bucket_fails_naming_the_file(cached: bool, own_server, synth_factory, tmp_path) -> None:
    """A raw dataset read from the bucket, paused mid-epoch: the next episode's read fails within
    about one call deadline, naming the mp4 or parquet it waited for (not minutes of retries)."""
    proc, _ = own_server
    fast, _, _ = _bucket(own_server, synth_factory, tmp_path)
    cache = {"cache_dir": str(tmp_path / "cache")} if cached else {}
    ds = EpisodePoolDataset("s3://paused/raw", storage_options=fast, shuffle=False, episode_pool_size=1, **cache)
    samples = iter(ds)
    next(samples)
    os.kill(proc.pid, signal.SIGSTOP)
    error = _outcome_within_guard(lambda: sum(1 for _ in samples))
    assert isinstance(error, OSError | DecodeError), error
    assert "check that the storage server is up" in str(error), str(error)
    assert re.search(r"s3://paused/raw/(videos|data)/[\w./-]+\.(mp4|parquet)", str(error)), str(error)
    assert re.search(r"no answer from the storage within \d+ s|Timeout", str(error)), str(error)
    os.kill(proc.pid, signal.SIGCONT)


def test_a_timed_out_upload_names_the_remote_object_not_the_local_file() -> None:
    """put_file's first argument is the local file: the message read s3:///tmp/.../shard-000000.tar."""
    import fsspec.asyn
    import fsspec.exceptions

    from lerobot_shards.timeouts import bounded

    class Stalled(fsspec.asyn.AsyncFileSystem):
        protocol = "s3"
        config_kwargs = {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 0}}

        def put_file(self, lpath, rpath, **kwargs):  # type: ignore[no-untyped-def]
            raise fsspec.exceptions.FSTimeoutError

    with pytest.raises(TimeoutError, match=r"^s3://bucket/out/shards/shard-000000.tar: no answer") as raised:
        bounded(
            Stalled(skip_instance_cache=True),
            "put_file",
            "/tmp/x/shard-000000.tar",
            "bucket/out/shards/shard-000000.tar",
        )
    assert "/tmp/x" not in str(raised.value)


def test_a_raw_episode_read_against_a_paused_server_waits_out_one_deadline(
    own_server, synth_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raw dataset read from the bucket without cache_dir, paused before its first episode's two mp4
    headers are read: they are read at once, and a failed read is raised, not read again (each read of a paused
    server waits out a whole call deadline: the error came after two, 106 s against README's 52 s).
    Checked by order, not by the clock: every call that timed out was in flight before the first
    one gave up."""
    import s3fs

    from lerobot_shards import lerobot_v3, timeouts

    proc, opts = own_server
    raw = synth_factory(num_episodes=4, length_range=(6, 8), episodes_per_video_file=1, episodes_per_data_file=1)
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("paused")
    fs.put(str(raw) + "/", "paused/raw", recursive=True)
    calls: list[tuple[float, float]] = []  # (start, end) of each call that timed out
    real = timeouts.bounded

    def timed(*args, **kwargs):
        start = time.monotonic()
        try:
            return real(*args, **kwargs)
        except Exception as e:
            if timeouts.is_timeout(e):
                calls.append((start, time.monotonic()))
            raise

    for module in (timeouts, lerobot_v3):
        monkeypatch.setattr(module, "bounded", timed)
    fast = {**opts, "config_kwargs": FAST}
    ds = EpisodePoolDataset(
        "s3://paused/raw", storage_options=fast, shuffle=False, episode_pool_size=1, prefetch_episodes=1
    )
    os.kill(proc.pid, signal.SIGSTOP)  # opened (metadata read), no mp4 header read yet
    error = _outcome_within_guard(lambda: sum(1 for _ in ds))
    os.kill(proc.pid, signal.SIGCONT)
    assert isinstance(error, OSError | DecodeError), error
    assert re.search(r"s3://paused/raw/(videos|data)/[\w./-]+\.(mp4|parquet)", str(error)), str(error)
    assert calls, "no read timed out"
    first_end = min(end for _, end in calls)
    assert all(start < first_end for start, _ in calls), calls  # none started after one had given up
