"""Helpers shared by the converter tests: reading shards back and preparing odd sources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_shards.format import (
    DIGEST_FIELD,
    MANIFEST_NAME,
    SHARDS_DIR,
    Manifest,
    Sidecar,
    clip_member,
    manifest_digest,
    sidecar_digest,
)
from lerobot_shards.mp4cut import Mp4File
from lerobot_shards.synth import read_identity
from lerobot_shards.video import decode_frames, encode_video
from waits import HANG_GUARD_S

CLI = [sys.executable, "-m", "lerobot_shards.cli"]


def run_cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=HANG_GUARD_S)


def reseal(out: Path) -> None:
    """Make a tampered dataset's metadata digests agree again (sidecar sha256s in the manifest, the
    sidecar pack rebuilt from the sidecars, the manifest's own digest), as an attacker who knows the
    format could: only the deeper checks remain."""
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    packed = []
    for record in manifest["shards"]:
        side = out / SHARDS_DIR / record["sidecar"]
        if "sidecar_sha256" in record and side.is_file():
            data = side.read_bytes()
            record.update(sidecar_sha256=sidecar_digest(data), sidecar_bytes=len(data))
            packed.append(data)
    pack = manifest.get("sidecar_pack")
    if isinstance(pack, dict) and isinstance(pack.get("name"), str) and len(packed) == len(manifest["shards"]):
        # the pack holds the sidecars as edited (one that is no longer a file leaves the pack as it was)
        data = b"".join(packed)
        (out / pack["name"]).write_bytes(data)
        pack.update(bytes=len(data), sha256=sidecar_digest(data))
    if DIGEST_FIELD in manifest:
        manifest[DIGEST_FIELD] = manifest_digest(manifest)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))


def unpack(out: Path) -> None:
    """Remove the sidecar pack and its manifest record (digest made to agree), as an earlier format 3
    conversion has it: the loader then reads each shard's sidecar file."""
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    (out / manifest.pop("sidecar_pack")["name"]).unlink()
    manifest[DIGEST_FIELD] = manifest_digest(manifest)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))


def output_files(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path: two conversions are the same when these are equal."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def load(out: Path) -> tuple[Manifest, dict[str, Sidecar]]:
    manifest = Manifest.from_json((out / MANIFEST_NAME).read_text())
    sidecars = {s.name: Sidecar.from_json((out / SHARDS_DIR / s.sidecar).read_text()) for s in manifest.shards}
    return manifest, sidecars


def member_bytes(out: Path, shard: str, sidecar: Sidecar, name: str) -> bytes:
    """One member by the sidecar's offset: what a loader's byte-range read gets."""
    m = next(e.members[name] for e in sidecar.episodes if name in e.members)
    with open(out / SHARDS_DIR / shard, "rb") as f:
        f.seek(m.offset)
        return f.read(m.size)


def boundary_frames(length: int) -> list[int]:
    return sorted({0, 1, length - 2, length - 1} & set(range(length)))


def assert_frame_identity(out: Path, *, bits: tuple[int, int] = (10, 10), stride: int = 0) -> int:
    """Decode each clip's first two and last two frames (and every ``stride``-th; 1: all) and read
    the painted identity back.

    Returns the number of frames checked; fails naming episode, camera and frame on any mismatch.
    """
    manifest, sidecars = load(out)
    checked = 0
    for record in manifest.shards:
        sidecar = sidecars[record.name]
        for entry in sidecar.episodes:
            for cam, clip in entry.clips.items():
                data = member_bytes(out, record.name, sidecar, clip_member(entry.key, cam))
                idx = sorted(set(boundary_frames(entry.length)) | set(range(0, entry.length, stride or entry.length)))
                frames = decode_frames(data, idx, frame_mappings=clip.frame_mappings_json())
                got = [
                    read_identity(f, frame_bits=bits[0], episode_bits=bits[1], transform=clip.transform) for f in frames
                ]
                want = [(entry.episode_index, i) for i in idx]
                assert got == want, f"episode {entry.episode_index} camera {cam}: frames {idx} read {got}"
                checked += len(idx)
    return checked


def reencode_continuous(root: Path, *, gop: int) -> None:
    """Re-encode every camera mp4 as one stream with keyframes every ``gop`` frames, so episodes
    no longer start on keyframes (as when a dataset was recorded continuously)."""
    for path in sorted((root / "videos").rglob("*.mp4")):
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            fps = float(stream.average_rate)
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(stream)]
        encode_video(frames, path, fps=fps, codec="h264", gop=gop, crf=18, threads=1)


def garble_frames(path: Path, frames: list[int]) -> None:
    """Overwrite the middle half of each listed frame's packet (frame = sample index) with random bytes,
    as a bad disk or a bad upload would: the file still demuxes, the packets no longer decode."""
    with Mp4File(str(path)) as mp4:
        offsets, sizes = mp4.track.offsets, mp4.track.sizes
    data = bytearray(path.read_bytes())
    for f in frames:
        off, size = int(offsets[f]), int(sizes[f])
        a, b = off + size // 4, off + 3 * size // 4
        data[a:b] = np.random.default_rng(f).integers(0, 256, b - a, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def edit_episodes(root: Path, fn) -> None:
    """Rewrite meta/episodes with ``fn(table) -> table``."""
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(fn(pq.read_table(path)), path)


def set_column(table: pa.Table, name: str, values) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, type=table.schema.field(name).type))


def held_cli(hold: Path, *args: object) -> list[str]:
    """The command line of ``lerobot-shards ARGS`` with every shard but shard 0 held until
    ``release(hold)`` (tests/held_convert.py): a run seen to have written shard 0 is mid-run."""
    return [sys.executable, str(Path(__file__).with_name("held_convert.py")), str(hold), *map(str, args)]


def release(hold: Path) -> None:
    """Let a ``held_cli`` run go on."""
    (hold / "release").touch()


def _claim_at_once(url: str, options: dict, crf: int, barrier, results) -> None:  # type: ignore[no-untyped-def]
    from lerobot_shards.convert.destination import Destination
    from lerobot_shards.convert.run import ConvertError, _claim

    barrier.wait()
    try:
        _claim(Destination(url, storage_options=options), {"format": "test", "crf": crf}, clear=False)
        results.put(crf)
    except ConvertError:
        results.put(None)


def claims_at_once(url: str, options: dict | None = None, processes: int = 4) -> list[int]:
    """``processes`` forked tasks claim ``url`` behind a barrier, each with its own record (``crf``):
    the records of those that won."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_at_once, args=(url, options or {}, crf, barrier, results)) for crf in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=HANG_GUARD_S)
    return [r for r in (results.get(timeout=HANG_GUARD_S) for _ in procs) if r is not None]
