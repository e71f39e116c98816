"""Faults around a conversion: the CLI's one-line errors, a killed parent, two converters at once."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from convert_helpers import CLI, claims_at_once, held_cli, output_files, release, run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR
from lerobot_shards.redaction import explain, redact, register_secrets
from waits import HANG_GUARD_S


def _one_line(result: subprocess.CompletedProcess) -> str:
    """The CLI failed with exactly one line on stderr, and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def _wait_for(predicate, proc: subprocess.Popen) -> None:
    """Wait until ``predicate()`` holds (shard 0 written by a held converter) or ``proc`` exits."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert predicate(), "the first converter should be mid-run"


def _mount_ns_cli(mount_opts: str, mountpoint: Path, *args: object) -> subprocess.CompletedProcess:
    """Run the CLI in a private mount namespace with a small tmpfs at ``mountpoint`` (needs root)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed: cannot mount a test file system")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here ({probe.stderr.decode().strip()})")
    mountpoint.mkdir(exist_ok=True)
    script = f'mount -t tmpfs -o {mount_opts} tmpfs "$0" && exec "$@"'
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(mountpoint), *CLI]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def source(synth_factory) -> Path:
    return synth_factory(num_episodes=4, cameras=("cam",), length_range=(8, 12))


# -- one clear line per error -------------------------------------------------------------------


def test_full_disk_is_one_line_naming_the_file(source: Path, tmp_path: Path) -> None:
    line = _one_line(
        _mount_ns_cli("size=16k", tmp_path / "mnt", "convert", source, tmp_path / "mnt/out", "--no-progress")
    )
    assert f"{tmp_path}/mnt/out/" in line and "no space left on the device; free space" in line


def test_read_only_destination_is_one_line(source: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        result = run_cli("convert", source, tmp_path / "ro/out", "--no-progress")
        hint = "permission denied"
    else:  # root writes anywhere: a read-only mount it is
        result = _mount_ns_cli("ro", tmp_path / "ro", "convert", source, tmp_path / "ro/out", "--no-progress")
        hint = "the file system is read-only; choose a writable destination"
    line = _one_line(result)
    assert f"{tmp_path}/ro/out" in line and hint in line


def test_missing_bucket_is_one_line(s3_server, source: Path) -> None:
    options = json.dumps(s3_server.storage_options)
    line = _one_line(
        run_cli("convert", source, "s3://no-such-bucket/ds", "--no-progress", "--storage-options", options)
    )
    assert line == "Error: s3://no-such-bucket/ds: bucket 'no-such-bucket' does not exist; create it or correct the URL"


@pytest.mark.slow
def test_bad_endpoint_is_one_line_without_the_endpoint(source: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = json.dumps(
        {
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
            "config_kwargs": {"retries": {"max_attempts": 1}},  # fail at once, not after retries
        }
    )
    convert_dataset(source, tmp_path / "out", progress=False)
    for command, url in (
        (["convert", source, "s3://bucket/ds"], "s3://bucket/ds"),
        (["upload", tmp_path / "out", "s3://bucket/up"], "s3://bucket/up"),
        (["verify", "s3://bucket/ds"], "s3://bucket/ds"),
        (["verify", tmp_path / "out", "--source", "s3://bucket/raw"], "s3://bucket/raw"),
    ):
        line = _one_line(run_cli(*command, "--no-progress", "--storage-options", options))
        named = re.escape(url) + r"(/[\w.-]+)+"  # the very object that got no answer
        assert re.fullmatch(
            f"Error: {named}: cannot connect to the storage endpoint; check endpoint_url in --storage-options "
            r"\(or AWS_ENDPOINT_URL\) and that the server is up",
            line,
        ), (command, line)


def test_unknown_storage_option_is_one_line(source: Path) -> None:
    options = json.dumps({"endpoint": "http://x", "client_kwargs": {}})
    line = _one_line(run_cli("convert", source, "s3://bucket/ds", "--no-progress", "--storage-options", options))
    assert "--storage-options: unknown option 'endpoint'" in line


def test_vv_shows_traceback_with_credentials_redacted(s3_server, source: Path) -> None:
    key, secret = "AKIDLEROBOTSHARDSTEST", "SECRETLEROBOTSHARDSTEST"
    options = {"key": key, "secret": secret, "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    result = run_cli(
        "-vv", "convert", source, "s3://no-such-bucket/ds", "--no-progress", "--storage-options", json.dumps(options)
    )
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "NoSuchBucket" in result.stderr
    assert "DEBUG lerobot_shards" in result.stderr or "DEBUG fsspec" in result.stderr  # -vv is debug output
    # ... but not botocore's: its request headers carry the access key id and session token
    assert "Authorization" not in result.stderr and "DEBUG botocore" not in result.stderr
    assert key not in result.stderr and secret not in result.stderr
    assert s3_server.endpoint_url not in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("Error: s3://no-such-bucket/ds: bucket")


def test_vv_shows_the_traceback_of_a_checked_error(tmp_path: Path) -> None:
    """A checked error (a source with no meta/info.json) is one line; -vv logs its traceback before it."""
    missing = tmp_path / "no-dataset"
    assert "Traceback" not in _one_line(run_cli("convert", missing, tmp_path / "out", "--no-progress"))
    result = run_cli("-vv", "convert", missing, tmp_path / "out", "--no-progress")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "SourceError" in result.stderr, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == f"Error: {missing}/meta/info.json: file not found"


def test_an_unguarded_script_with_workers_is_told_about_the_main_guard(source: Path, tmp_path: Path) -> None:
    """convert_dataset(workers=2) at a script's top level: each spawned worker imports the script and
    runs the conversion again; the parent's error says why, not just "a process terminated abruptly"."""
    script = tmp_path / "convert_script.py"
    script.write_text(
        "from lerobot_shards.convert import ConvertOptions, convert_dataset\n"
        f"convert_dataset({str(source)!r}, {str(tmp_path / 'out')!r}, ConvertOptions(episodes_per_shard=1), "
        "workers=2, progress=False)\n"
    )
    result = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lerobot_shards.exceptions.ConvertError: ") and 'if __name__ == "__main__":' in last, (
        result.stderr[-3000:]
    )
    call = script.read_text().splitlines()[1]
    script.write_text(script.read_text().replace(call, f'if __name__ == "__main__":\n    {call}'))
    assert subprocess.run([sys.executable, script.name], cwd=tmp_path, timeout=HANG_GUARD_S).returncode == 0


def test_error_mapping_and_redaction() -> None:
    assert explain(OSError(errno.ENOSPC, "No space left on device", "/data/out/shards/x.tar.tmp")) == (
        "/data/out/shards/x.tar.tmp: no space left on the device; free space or choose a destination with more room"
    )
    assert explain(OSError(errno.ENOSPC, "No space left on device"), ["src", "/data/out"]).startswith(
        "/data/out: no space"
    )
    assert explain(RuntimeError("boom")) == "RuntimeError: boom (run with -vv for the traceback)"
    register_secrets({"key": "AKIDREDACTME", "client_kwargs": {"aws_secret_access_key": "SECRETREDACTME"}})
    text = redact(
        "headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIDX/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=0123abcd'} url=https://b.s3/k?X-Amz-Signature=feed&X-Amz-Credential=AKIDY%2F "
        "key AKIDREDACTME secret SECRETREDACTME Signature:\n" + "ab" * 32
    )
    for leaked in ("AKIDX", "0123abcd", "feed", "AKIDY", "AKIDREDACTME", "SECRETREDACTME", "ab" * 32):
        assert leaked not in text, (leaked, text)


def test_endpoints_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Endpoint URLs from storage options (top level or in client_kwargs) and the environment become
    ``<endpoint>`` as URL, ``host:port`` and ``('host', port)``; bucket URLs and other hosts stay."""
    register_secrets({"endpoint_url": "https://minio.internal.example:9443/"})
    register_secrets({"key": "k", "client_kwargs": {"endpoint_url": "http://10.11.12.13:19000"}})
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://10.4.5.6:29000")
    text = redact(
        'Could not connect to the endpoint URL: "http://10.11.12.13:19000/bucket/ds/shards/shard-000003.tar"; '
        "Cannot connect to host 10.11.12.13:19000 ssl:default [Connect call failed ('10.11.12.13', 19000)]; "
        "https://minio.internal.example:9443/b/k; minio.internal.example:9443; 10.4.5.6:29000"
    )
    for leaked in ("10.11.12.13:", "'10.11.12.13'", "minio.internal", "10.4.5.6"):
        assert leaked not in text, (leaked, text)
    assert text.startswith('Could not connect to the endpoint URL: "<endpoint>/bucket/ds/shards/shard-000003.tar"')
    assert "[Connect call failed (<endpoint>)]" in text and text.endswith("<endpoint>/b/k; <endpoint>; <endpoint>")
    others = "s3://bucket/ds 10.11.12.130:19000 10.11.12.13:190001 ('10.11.12.13', 1900)"
    assert redact(others) == others  # bucket URLs, other hosts and ports
    for name in ("AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL"):  # read when redacting, not when registering
        monkeypatch.setenv(name, "http://storage.example.net:7480")
        assert redact("GET http://storage.example.net:7480/b/k") == "GET <endpoint>/b/k"
        monkeypatch.delenv(name)


def test_endpoints_with_user_info_or_without_a_port() -> None:
    """``user:pw@host:port``: the host is what gets hidden, not the user name; a one-word host
    without a port is hidden only inside its URL (it is also an ordinary word)."""
    register_secrets({"endpoint_url": "https://svc:pw@objects.internal.example:9000"})
    register_secrets({"endpoint_url": "http://storage"})
    text = redact("Cannot connect to host objects.internal.example:9000; /home/svc/data; GET http://storage/b/k")
    assert text == "Cannot connect to host <endpoint>; /home/svc/data; GET <endpoint>/b/k"
    assert redact("check that the storage server is up") == "check that the storage server is up"


def test_explain_does_not_name_the_endpoint() -> None:
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    register_secrets({"client_kwargs": {"endpoint_url": "http://10.21.22.23:39000"}})
    request = "http://10.21.22.23:39000/bucket/ds/manifest.json"
    hint = "check endpoint_url in --storage-options (or AWS_ENDPOINT_URL) and that the server is up"
    assert explain(EndpointConnectionError(endpoint_url=request), ["/data/src", "s3://bucket/ds"]) == (
        f"s3://bucket/ds/manifest.json: cannot connect to the storage endpoint; {hint}"
    )
    assert (
        explain(ConnectTimeoutError(endpoint_url=request))
        == f"storage: timed out talking to the storage endpoint; {hint}"
    )
    assert explain(RuntimeError(f"failed: {request}")) == (
        "RuntimeError: failed: <endpoint>/bucket/ds/manifest.json (run with -vv for the traceback)"
    )


def test_a_parquet_read_timeout_is_a_storage_error_without_the_endpoint_not_a_bad_file() -> None:
    """A timeout while reading a source parquet is not the file's fault: --skip-bad-episodes must
    not drop its episodes (SourceError), and the error names the file, not the endpoint."""
    from lerobot_shards.lerobot_v3 import SourceError, _read_parquet

    register_secrets({"endpoint_url": "http://10.31.32.33:49000"})

    class TimingOut:  # object storage (a local path is first checked to be a regular file)
        protocol = ("s3", "s3a")

        def cat_file(self, path: str) -> bytes:
            raise TimeoutError(f"Read timeout on endpoint URL: http://10.31.32.33:49000/{path}")

    class Garbled:
        protocol = ("s3", "s3a")

        def cat_file(self, path: str) -> bytes:
            return b"PAR1 not really parquet"

    with pytest.raises(OSError) as failure:
        _read_parquet(TimingOut(), "bucket/ds/data/file-000.parquet")  # type: ignore[arg-type]
    assert not isinstance(failure.value, SourceError)
    assert str(failure.value) == (
        "bucket/ds/data/file-000.parquet: cannot read it (TimeoutError: Read timeout on endpoint URL: "
        "<endpoint>/bucket/ds/data/file-000.parquet); check that the storage is reachable and run again"
    )
    assert failure.value.__cause__ is None
    with pytest.raises(SourceError, match=r"file-000.parquet: not a readable parquet file"):
        _read_parquet(Garbled(), "bucket/ds/data/file-000.parquet")  # type: ignore[arg-type]


# -- a killed parent takes its workers along ----------------------------------------------------


@pytest.mark.slow
def test_workers_die_with_a_killed_parent(synth_factory, tmp_path: Path) -> None:
    root = synth_factory(num_episodes=24, cameras=("cam",), length_range=(30, 40))
    out = tmp_path / "out"
    args = ["--episodes-per-shard", "1", "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(held_cli(tmp_path, "convert", root, out, *args), stderr=subprocess.DEVNULL)
    _wait_for(lambda: (out / SHARDS_DIR / "shard-000000.idx.json").exists(), proc)  # the others are held
    children = psutil.Process(proc.pid).children(recursive=True)
    assert sum("multiprocessing-fork" in " ".join(c.cmdline()) for c in children) == 2, "two workers should run"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / MANIFEST_NAME).exists(), "the kill should land mid-conversion"
    _, alive = psutil.wait_procs(children, timeout=HANG_GUARD_S)
    assert not alive, f"still running after the parent's death: {[c.cmdline() for c in alive]}"

    result = run_cli("convert", root, out, *args)
    assert result.returncode == 0, result.stderr
    assert not list((out / SHARDS_DIR).glob("*.tmp")), "the re-run removes the killed run's temporary files"
    assert verify_dataset(out, root).ok  # checksums, members, coverage


# -- two converters into one destination --------------------------------------------------------


def test_second_converter_into_the_same_destination_is_refused(synth_factory, tmp_path: Path) -> None:
    """The first converter, paused (SIGSTOP) mid-run while holding its lock, makes the second exit
    with one line; resumed, it completes a correct output. Array tasks (disjoint shards) coexist."""
    root = synth_factory(num_episodes=24, cameras=("cam",), length_range=(30, 40))
    out = tmp_path / "out"
    args = [root, out, "--episodes-per-shard", "1", "--no-progress"]
    hold = tmp_path / "hold"
    hold.mkdir()
    first = subprocess.Popen(held_cli(hold, "convert", *args), stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (out / SHARDS_DIR / "shard-000000.idx.json").exists(), first)
    line = _one_line(run_cli("convert", *args))  # the first holds its lock, held at shard 1
    # --finalize --overwrite deletes a conversion's files: it waited for no lock and deleted these.
    finalizing = _one_line(run_cli("convert", *args, "--finalize", "--overwrite", "--reencode", "h264"))
    assert f"{out}: another conversion is writing shards here right now" in finalizing
    assert (out / SHARDS_DIR / "shard-000000.tar").exists()
    release(hold)
    assert f"{out}: another conversion is writing shards 0..23 here right now" in line and "re-run" in line
    assert first.wait(timeout=HANG_GUARD_S) == 0, first.stderr.read()
    assert verify_dataset(out, root).ok
    convert_dataset(root, tmp_path / "ref", ConvertOptions(episodes_per_shard=1), progress=False)
    assert output_files(out) == output_files(tmp_path / "ref")

    array = tmp_path / "array"
    task = ["convert", root, array, "--episodes-per-shard", "1", "--no-progress", "--num-tasks", "2"]
    hold = tmp_path / "hold-array"
    hold.mkdir()
    zero = subprocess.Popen(held_cli(hold, *task, "--task-index", "0"), stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (array / SHARDS_DIR / "shard-000000.idx.json").exists(), zero)
    one = run_cli(*task, "--task-index", "1")  # beside task 0, which is mid-run
    release(hold)
    assert one.returncode == 0 and "manifest waits for the other tasks" in one.stdout, one.stderr
    assert zero.wait(timeout=HANG_GUARD_S) == 0, zero.stderr.read()
    assert output_files(array) == output_files(tmp_path / "ref")


def test_tasks_claiming_at_once_with_other_options_one_wins(tmp_path: Path) -> None:
    """Array tasks started together with other options each saw no run record, each wrote its own
    (the last rename won) and both converted, under one record. The record is now created
    exclusively: exactly one task claims the destination, the others read its record and stop."""
    won = claims_at_once(str(tmp_path))
    assert len(won) == 1
    assert json.loads((tmp_path / "convert.json").read_text())["crf"] == won[0]


def test_a_worker_that_cannot_open_the_source_raises_why_not_a_broken_pool(tmp_path: Path) -> None:
    """A converter worker's initializer read the source and, failing (a bucket stalled while workers
    started), broke the pool: "terminated abruptly", the cause only in a raw traceback. The error
    now comes with the worker's first shard, named."""
    code = f"""
import multiprocessing, os
from lerobot_shards.convert.plan import ConvertOptions, RunOptions
from lerobot_shards.convert import run
setup = run._WorkerSetup(({str(tmp_path / "gone")!r}, {{}}), None, ({str(tmp_path / "out")!r}, {{}}),
                         ConvertOptions(), RunOptions(), 20, os.getppid())
run._init_worker(setup, multiprocessing.get_context("spawn").Queue())
try:
    run._worker_shard(None)
except Exception as e:
    print(type(e).__name__, e)
"""
    result = subprocess.run([CLI[0], "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert "gone" in result.stdout and "Error" in result.stdout.split()[0], result.stdout + result.stderr


def test_staging_folders_of_killed_uploads_are_swept_and_nothing_else(tmp_path: Path) -> None:
    """A conversion to a bucket killed mid-shard left its staging folder (a shard) in TMPDIR for good."""
    from lerobot_shards.convert.destination import STALE_STAGING_S, sweep_staging

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name in (f"lerobot-shards-staging-{dead.pid}-abc", f"lerobot-shards-staging-{os.getpid()}-def", "mine"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "shard-000000.tar").write_bytes(b"x")
    (tmp_path / f"lerobot-shards-staging-{dead.pid}-link").symlink_to(tmp_path / "mine")
    later = time.time() + STALE_STAGING_S + 60
    assert sweep_staging(str(tmp_path), now=time.time()) == 0  # recent: maybe another namespace's, writing
    assert sweep_staging(str(tmp_path), now=later) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"lerobot-shards-staging-{os.getpid()}-def", "mine", f"lerobot-shards-staging-{dead.pid}-link"]
    )
    assert (tmp_path / "mine" / "shard-000000.tar").exists()


def test_the_run_record_is_created_exclusively_without_hard_links(tmp_path: Path, monkeypatch) -> None:
    """A file system without hard links (some FUSE mounts) failed the exclusive create outright."""
    from lerobot_shards.convert.destination import Destination

    def no_links(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    dest = Destination(str(tmp_path))
    assert dest.create_bytes("convert.json", b"first") is True
    assert dest.create_bytes("convert.json", b"second") is False
    assert (tmp_path / "convert.json").read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["convert.json"]  # no temporary file left
