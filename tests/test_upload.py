"""``lerobot-shards upload`` against the real S3-protocol server: identity, resume after SIGKILL,
skips, corrupt local shards, and no credentials or endpoints in what it writes or says."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from convert_helpers import output_files, reseal, run_cli
from lerobot_shards.convert.destination import LOCK_NAME, Destination, TransferError
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.upload import UploadError, upload_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity

CAM = "observation.images.front"
SECRET = "upload-test-secret-9f27c1d"  # moto accepts any key pair: a secret we can look for


@pytest.fixture(scope="module")
def converted(tmp_path_factory, synth_factory) -> Path:
    """A tiny conversion: 4 episodes of 6-9 frames, one camera, 2 episodes per shard (2 shards)."""
    raw = synth_factory(num_episodes=4, cameras=(CAM,), length_range=(6, 9), seed=5)
    out = tmp_path_factory.mktemp("upload") / "converted"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def _options(s3_server) -> dict:
    return {"key": "upload-test-key", "secret": SECRET, "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}


def _bucket(s3_server, name: str):
    fs = s3_server.filesystem()
    fs.mkdir(name)
    return fs


def _remote_files(fs, root: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {p[len(root) + 1 :]: fs.cat_file(p) for p in sorted(fs.find(root))}


def _local_files(out: Path) -> dict[str, bytes]:
    """What an upload must copy: everything but the local lock file."""
    return {k: v for k, v in output_files(out).items() if k != LOCK_NAME}


def _etags(fs, root: str) -> dict[str, str]:
    fs.invalidate_cache()
    return {p[len(root) + 1 :]: info["ETag"] for p, info in fs.find(root, detail=True).items()}


def _samples(url: str, **kwargs) -> tuple[list[dict], EpisodePoolDataset]:
    ds = EpisodePoolDataset(url, seed=3, episode_pool_size=2, cameras=[CAM], **kwargs)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    return batches, ds


def test_upload_then_load_from_bucket(converted: Path, s3_server) -> None:
    fs = _bucket(s3_server, "upload-load")
    options = _options(s3_server)
    result = run_cli(
        "-v", "upload", converted, "s3://upload-load/ds", "--workers", "2", "--storage-options", json.dumps(options)
    )
    assert result.returncode == 0, result.stderr
    # two shards (tar and sidecar each), the sidecar pack, the manifest
    assert "uploaded 6 files" in result.stdout and "skipped 0" in result.stdout, result.stdout
    assert _remote_files(fs, "upload-load/ds") == _local_files(converted)  # every file, byte for byte

    local, _ = _samples(str(converted))
    remote, ds = _samples("s3://upload-load/ds", storage_options=options)
    assert len(local) == len(remote) > 0
    for a, b in zip(local, remote):
        assert a.keys() == b.keys()
        for key in a:
            same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
            assert same, key
    for batch in remote:
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAM][i]) == (ep, frame)

    # nothing the upload writes or says, nor the loader's stats, holds the secret or the endpoint
    said = result.stdout + result.stderr + fs.cat_file("upload-load/ds/manifest.json").decode() + str(ds.stats())
    assert SECRET not in said and s3_server.endpoint_url.split("//")[1] not in said

    # a second run finds everything there: nothing sent, nothing rewritten
    before = _etags(fs, "upload-load/ds")
    summary = upload_dataset(converted, "s3://upload-load/ds", storage_options=options, progress=False)
    assert (summary.uploaded_files, summary.skipped_files) == (0, 5)
    assert _etags(fs, "upload-load/ds") == before


def test_upload_killed_and_rerun_resumes_with_manifest_last(converted: Path, s3_server) -> None:
    fs = _bucket(s3_server, "upload-kill")
    options = _options(s3_server)
    root = "upload-kill/ds"
    # The upload's own fault-injection point: once the first shard is stored the child says so and
    # blocks its only sending thread, so the kill lands there for sure (no timing involved).
    child = (
        "import json, sys, threading\n"
        "from lerobot_shards.convert.upload import upload_dataset\n"
        "def stop(name):\n"
        "    print('sent', name, flush=True)\n"
        "    threading.Event().wait()\n"
        "upload_dataset(sys.argv[1], sys.argv[2], workers=1, storage_options=json.loads(sys.argv[3]),\n"
        "               progress=False, on_shard_sent=stop)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(converted), f"s3://{root}", json.dumps(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the child is stopped after its first shard
        assert line == "sent shard-000000.tar\n", (line, proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    killed = _etags(fs, root)
    assert sorted(killed) == ["convert.json", "shards/shard-000000.idx.json", "shards/shard-000000.tar"]

    result = run_cli("upload", converted, f"s3://{root}", "--storage-options", json.dumps(options), "--no-progress")
    assert result.returncode == 0, result.stderr
    # the second shard, the sidecar pack, the manifest
    assert "uploaded 4 files" in result.stdout and "skipped 2 already there" in result.stdout, result.stdout
    assert _remote_files(fs, root) == _local_files(converted)
    after = _etags(fs, root)
    assert {k: after[k] for k in killed} == killed  # the first shard was not sent again
    modified = {p[len(root) + 1 :]: i["LastModified"] for p, i in fs.find(root, detail=True).items()}
    assert modified["manifest.json"] == max(modified.values())


def test_corrupt_local_shard_is_refused(converted: Path, s3_server, tmp_path: Path) -> None:
    fs = _bucket(s3_server, "upload-corrupt")
    out = tmp_path / "converted"
    shutil.copytree(converted, out)
    tar = out / "shards/shard-000001.tar"
    data = bytearray(tar.read_bytes())
    data[-2000:-1992] = bytes(b ^ 0xFF for b in data[-2000:-1992])  # same size, other bytes
    tar.write_bytes(bytes(data))
    with pytest.raises(UploadError, match=r"shard-000001\.tar.*corrupt"):
        upload_dataset(out, "s3://upload-corrupt/ds", workers=1, storage_options=_options(s3_server), progress=False)
    fs.invalidate_cache()
    remote = sorted(p.rsplit("/", 1)[1] for p in fs.find("upload-corrupt/ds"))
    assert "shard-000001.tar" not in remote and "shard-000001.idx.json" not in remote
    assert "manifest.json" not in remote


def test_upload_needs_a_finished_conversion_and_an_own_destination(converted: Path, s3_server, tmp_path) -> None:
    fs = _bucket(s3_server, "upload-refuse")
    partial = tmp_path / "partial"
    shutil.copytree(converted, partial)
    (partial / "manifest.json").unlink()
    result = run_cli("upload", partial, "s3://upload-refuse/a", "--storage-options", json.dumps(_options(s3_server)))
    assert result.returncode == 1 and "manifest.json: missing" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    fs.pipe_file("upload-refuse/b/other.txt", b"not ours")
    with pytest.raises(Exception, match="not lerobot-shards output"):
        upload_dataset(converted, "s3://upload-refuse/b", storage_options=_options(s3_server), progress=False)
    assert fs.find("upload-refuse/b") == ["upload-refuse/b/other.txt"]


def test_remote_writes_retry_transient_errors_a_bounded_number_of_times(s3_server) -> None:
    dest = Destination("s3://upload-retry/ds", storage_options=_options(s3_server))
    endpoint = s3_server.endpoint_url
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(f"connection to {endpoint} reset")
        return "stored"

    assert dest.retrying("s3://upload-retry/ds/x", flaky) == "stored" and len(calls) == 3

    calls.clear()

    def down() -> None:
        calls.append(1)
        raise ConnectionRefusedError(
            f"Could not connect to the endpoint URL: {endpoint}/upload-retry/ds (key {SECRET})"
        )

    with pytest.raises(TransferError) as failure:
        dest.retrying("s3://upload-retry/ds/shards/shard-000000.tar", down, attempts=3)
    assert len(calls) == 3
    text = str(failure.value)
    assert "shard-000000.tar: failed after 3 attempts" in text and SECRET not in text

    calls.clear()

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("upload-retry: no such bucket")

    with pytest.raises(FileNotFoundError):
        dest.retrying("s3://upload-retry/ds/x", missing)
    assert len(calls) == 1  # permanent: not retried


def _tamper_sidecar(out: Path) -> None:
    side = out / "shards/shard-000001.idx.json"
    d = json.loads(side.read_text())
    d["episodes"][0]["clips"][CAM]["frames"]["pts"][1] += 1  # still increasing: only a digest tells
    side.write_text(json.dumps(d, separators=(",", ":")))


def _tamper_manifest(out: Path) -> None:
    m = json.loads((out / "manifest.json").read_text())
    m["tasks"][0] = "another task"
    (out / "manifest.json").write_text(json.dumps(m, indent=1))


def _sidecar_of_other_shard(out: Path) -> None:
    """The attacker recomputes the digests: the sidecar then vouches for a shard the manifest does not list."""
    side = out / "shards/shard-000001.idx.json"
    d = json.loads(side.read_text())
    d["sha256"] = "0" * 64
    side.write_text(json.dumps(d, separators=(",", ":")))
    reseal(out)


def _tampered_copy(prefix: str, tamper, converted: Path, s3_server, tmp_path: Path):
    """A fresh bucket of this test's own and a copy of the conversion with ``tamper`` applied."""
    bucket = f"{prefix}-{tmp_path.name[-12:].lower().replace('_', '-')}"
    fs = _bucket(s3_server, bucket)
    out = tmp_path / "converted"
    shutil.copytree(converted, out)
    tamper(out)
    return fs, bucket, out


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_tamper_sidecar, r"shard-000001\.idx\.json: does not match the sha256 the manifest records for it"),
        (_tamper_manifest, r"manifest\.json: content does not match its manifest_sha256"),
        (_sidecar_of_other_shard, r"shard-000001\.idx\.json: describes shard-000001\.tar .* the manifest"),
    ],
    ids=["sidecar edited", "manifest edited", "sidecar edited, digests recomputed"],
)
def test_tampered_local_metadata_is_refused_before_anything_is_sent(
    tamper, message: str, converted: Path, s3_server, tmp_path: Path
) -> None:
    fs, bucket, out = _tampered_copy("upload-tamper", tamper, converted, s3_server, tmp_path)
    result = run_cli("upload", out, f"s3://{bucket}/ds", "--storage-options", json.dumps(_options(s3_server)))
    assert result.returncode == 1 and re.search(message, result.stderr), result.stderr
    assert "nothing was uploaded" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    fs.invalidate_cache()
    assert fs.find(bucket) == []  # not even convert.json: refused before the destination is touched


def _tar_symlinked_out(out: Path) -> None:
    tar = out / "shards/shard-000001.tar"
    outside = out.parent / "elsewhere.tar"
    shutil.move(tar, outside)
    tar.symlink_to(outside)


def _tar_a_fifo(out: Path) -> None:
    tar = out / "shards/shard-000001.tar"
    tar.unlink()
    os.mkfifo(tar)  # hashing it would block forever


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_tar_symlinked_out, r"shard-000001\.tar: is a symlink to .*, outside the dataset"),
        (_tar_a_fifo, r"shard-000001\.tar: not a regular file"),
    ],
    ids=["symlinked out of OUT", "a FIFO"],
)
def test_a_shard_that_is_no_file_of_the_conversion_is_not_sent(
    tamper, message: str, converted: Path, s3_server, tmp_path: Path
) -> None:
    fs, bucket, out = _tampered_copy("upload-nofile", tamper, converted, s3_server, tmp_path)
    with pytest.raises(UploadError, match=message):
        upload_dataset(out, f"s3://{bucket}/ds", workers=1, storage_options=_options(s3_server), progress=False)
    fs.invalidate_cache()
    remote = sorted(p.rsplit("/", 1)[1] for p in fs.find(bucket))
    assert "shard-000001.tar" not in remote and "manifest.json" not in remote, remote


@pytest.mark.parametrize("where", ["same", "inside", "holds", "file URL"])
def test_upload_into_the_conversion_itself_is_refused(converted: Path, tmp_path: Path, where: str) -> None:
    """Uploading a conversion into itself, a folder inside it or one holding it would write into
    (with --overwrite, clear) the files being sent: refused before anything is written."""
    out = Path(shutil.copytree(converted, tmp_path / "converted"))
    dest = {"same": str(out), "inside": str(out / "up"), "holds": str(tmp_path), "file URL": f"file://{out}"}[where]
    before = output_files(tmp_path)
    relation = {"inside": "lies inside", "holds": "holds"}.get(where, "is")
    with pytest.raises(UploadError, match=rf"{re.escape(dest)}: {relation} the conversion {re.escape(str(out))}"):
        upload_dataset(out, dest, overwrite=True, progress=False)
    assert output_files(tmp_path) == before


def test_a_shard_whose_every_put_is_refused_is_named_as_the_remote_object(
    converted: Path, s3_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every PUT of one shard answered 503 (injected into the real S3 client): the upload fails naming
    the remote object, in its error and in the CLI's line, not the local folder it was given first."""
    import s3fs
    from botocore.exceptions import ClientError

    from lerobot_shards.convert import destination
    from lerobot_shards.redaction import explain

    fs, bucket, out = _tampered_copy("refused", lambda out: None, converted, s3_server, tmp_path)
    real = s3fs.S3FileSystem._put_file

    async def refused(self, lpath, rpath, *args, **kwargs):  # type: ignore[no-untyped-def]
        if rpath.endswith("shard-000000.tar"):
            raise ClientError({"Error": {"Code": "503", "Message": "Slow Down"}}, "PutObject")
        return await real(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", refused)
    # A file system cached by an earlier test with these options mirrored the real method when made
    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setattr(destination, "RETRY_FIRST_WAIT_S", 0.01)
    url = f"s3://{bucket}/ds"
    with pytest.raises(TransferError) as raised:
        upload_dataset(out, url, storage_options=_options(s3_server), workers=1, progress=False)
    remote = f"{url}/shards/shard-000000.tar"
    assert str(raised.value).startswith(f"{remote}: failed after 5 attempts"), str(raised.value)
    line = explain(raised.value, [str(out), url])
    assert line.startswith(f"{remote}: ") and str(out) not in line, line
