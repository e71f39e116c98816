"""Hostile metadata, case by case: each edit of a converted dataset (with its digests recomputed, as an
attacker who knows the format would) or of a raw LeRobot v3.0 dataset either fails in one line naming
the file and the field or episode (a ``LeRobotShardsError``, before any wrong frame is emitted, with
bounded memory), or is harmless: the epoch then holds exactly the clean dataset's frames, each
showing its own identity. Unsealed edits of a converted dataset are refused by the digests
(tests/test_metadata.py)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from convert_helpers import reseal, unpack
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.exceptions import LeRobotShardsError
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity

CAMS = ("observation.images.front", "observation.images.top")
STATE = "observation.state"
SIDE0 = "shards/shard-000000.idx.json"
TAR0 = "shards/shard-000000.tar"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
DATA0 = "data/chunk-000/file-000.parquet"
MP4 = f"videos/{CAMS[0]}/chunk-000/file-000.mp4"
HARMLESS = None  # expected outcome: the clean dataset's frames

Edit = Callable[[Path], Any]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, synth_factory) -> tuple[Path, Path]:
    """A raw dataset (3 episodes of 6-8 frames, 2 cameras, 2 episodes per file) and its conversion (2 shards)."""
    raw = synth_factory(num_episodes=3, length_range=(6, 8), cameras=CAMS, height=32, width=48)
    out = tmp_path_factory.mktemp("hostile") / "converted"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return raw, out


def _epoch(root: Path) -> list[tuple[int, int]]:
    """One epoch in windows (fps matters), every camera frame read back as the frame it claims to be."""
    ds = EpisodePoolDataset(
        str(root), delta_timestamps={"action": [0.0, 1 / 30], CAMS[0]: [-1 / 30, 0.0]}, episode_pool_size=2, seed=0
    )
    got = []
    for batch in DataLoader(ds, batch_size=4, num_workers=0):
        for i, key in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAMS[0]][i][-1]) == key and read_identity(batch[CAMS[1]][i]) == key, key
            got.append(key)
    return sorted(got)


@pytest.fixture(scope="module")
def clean(datasets: tuple[Path, Path]) -> list[tuple[int, int]]:
    frames = _epoch(datasets[1])
    assert frames == _epoch(datasets[0]) and len(frames) > 10
    return frames


# -- edits --------------------------------------------------------------------------------------


def _json(rel: str, f: Callable[[Any], Any]) -> Edit:
    def edit(root: Path) -> None:
        d = json.loads((root / rel).read_text())
        f(d)
        (root / rel).write_text(json.dumps(d))

    return edit


def manifest(f: Callable[[dict], Any]) -> Edit:
    return _json("manifest.json", f)


def shard0(f: Callable[[dict], Any]) -> Edit:
    return manifest(lambda m: f(m["shards"][0]))


def sidecar(f: Callable[[dict], Any]) -> Edit:
    return _json(SIDE0, lambda s: f(s["episodes"][0]))


def info(f: Callable[[dict], Any]) -> Edit:
    return _json("meta/info.json", f)


def state(f: Callable[[dict], Any]) -> Edit:
    return info(lambda d: f(d["features"][STATE]))


def rows(rel: str, f: Callable[[list[dict]], list[dict] | None]) -> Edit:
    """Edit a parquet file row by row (its schema kept when the values still fit it)."""

    def edit(root: Path) -> None:
        table = pq.read_table(root / rel)
        old = table.to_pylist()
        new = f(old)
        new = old if new is None else new
        try:
            out = pa.Table.from_pylist(new, schema=table.schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            out = pa.Table.from_pylist(new)  # e.g. a NaN in an integer column: the column becomes double
        pq.write_table(out, root / rel)

    return edit


def put(d: dict, **values: Any) -> None:
    d.update(values)


def first(key: str, value: Any) -> Callable[[list[dict]], None]:
    return lambda rs: put(rs[0], **{key: value})


def every(key: str, value: Any) -> Callable[[list[dict]], None]:
    return lambda rs: [put(r, **{key: value}) for r in rs] and None


def fps_everywhere(fps: int) -> Callable[[dict], None]:
    """info.json's fps and every camera's video.fps set alike (the files still play at 30)."""

    def f(d: dict) -> None:
        d["fps"] = fps
        for spec in d["features"].values():
            if spec["dtype"] == "video":
                spec["info"]["video.fps"] = fps

    return f


def clip_moved(episode: int, frames: float) -> Callable[[list[dict]], None]:
    """An episode's front-camera from/to_timestamp moved by a fraction of a frame (at 30 fps)."""

    def f(rs: list[dict]) -> None:
        for k in ("from_timestamp", "to_timestamp"):
            rs[episode][f"videos/{CAMS[0]}/{k}"] += frames / 30

    return f


def length(n: Any) -> Callable[[list[dict]], None]:
    def f(rs: list[dict]) -> None:
        rs[0]["length"] = n
        if type(n) is int:
            rs[0]["dataset_to_index"] = rs[0]["dataset_from_index"] + n

    return f


def both(f: Callable[[dict], Any], name: str = STATE) -> Edit:
    """The same edit of a feature in ``features`` and in ``source_info.features``: consistent."""
    return manifest(lambda m: (f(m["features"][name]), f(m["source_info"]["features"][name])))


def _lengths(m: dict, delta: int) -> None:
    s = m["shards"][0]
    s["episode_lengths"][0] += delta
    s["frames"] += delta
    m["totals"]["frames"] += delta


def _huge_length(m: dict) -> None:
    _lengths(m, 10**9 - m["shards"][0]["episode_lengths"][0])


def _swap_sidecars(m: dict) -> None:
    a, b = m["shards"]
    for key in ("sidecar", "sidecar_sha256", "sidecar_bytes"):
        a[key], b[key] = b[key], a[key]


def _drop_feature(m: dict) -> None:
    del m["features"][STATE], m["source_info"]["features"][STATE]


def _add_feature(m: dict) -> None:
    for d in (m["features"], m["source_info"]["features"]):
        d["observation.extra"] = {"dtype": "float32", "shape": [2], "names": None}


def _drop_camera(m: dict) -> None:
    m["cameras"] = m["cameras"][:1]
    del m["features"][CAMS[1]], m["source_info"]["features"][CAMS[1]]


def _swap_camera_members(e: dict) -> None:
    a, b = (m for m in e["members"] if m["name"].endswith(".mp4"))
    a["name"], b["name"] = b["name"], a["name"]


def _swap_pts(e: dict) -> None:
    pts = e["clips"][CAMS[0]]["frames"]["pts"]
    pts[2], pts[3] = pts[3], pts[2]


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _to_dir(p: Path) -> None:
    p.unlink()
    p.mkdir()


def _truncate(p: Path) -> None:
    os.truncate(p, p.stat().st_size // 2)


def _pop(key: str) -> Callable[[list[dict]], list[dict]]:
    return lambda rs: [{k: v for k, v in r.items() if k != key} for r in rs]


def _shift(delta: int) -> Callable[[list[dict]], None]:
    def f(rs: list[dict]) -> None:
        rs[0]["dataset_from_index"] += delta
        rs[0]["dataset_to_index"] += delta

    return f


# -- cases: (id, edit, what the message must say, or HARMLESS) -------------------------------------

MANIFEST = r"manifest\.json: .*"
SIDECAR = r"shard-000000\.idx\.json: .*"

CONVERTED: list[tuple[str, Edit, str | None]] = [
    ("fps 0", manifest(lambda m: put(m, fps=0)), MANIFEST + r"fps = 0 is not a frame rate"),
    ("fps inf", manifest(lambda m: put(m, fps=math.inf)), MANIFEST + r"fps = inf is not a finite number"),
    (
        "fps x2 with source_info",
        manifest(lambda m: put(m, fps=60, source_info={**m["source_info"], "fps": 60})),
        r"shard-00000\d\.tar: episode \d: e00000\d\.json says fps 30\.0, the manifest 60",
    ),
    ("fps missing", manifest(lambda m: m.pop("fps")), MANIFEST + "missing field 'fps'"),
    (
        "episode_lengths lowered",
        manifest(lambda m: _lengths(m, -2)),
        SIDECAR + r"episode lengths \[8, 7\], the manifest's",
    ),
    (
        "episode_lengths raised",
        manifest(lambda m: _lengths(m, 2)),
        SIDECAR + r"episode lengths \[8, 7\], the manifest's",
    ),
    (
        "episode_lengths 10^9",
        manifest(_huge_length),
        MANIFEST + r"shards\[0\]\.episode_lengths\[0\] = 1000000000 is out of range",
    ),
    (
        "episode_lengths 10^6",
        manifest(lambda m: _lengths(m, 10**6)),
        MANIFEST + r"shards\[0\]: frames = \d+ cannot fit in its \d+ bytes",
    ),
    ("episode_lengths 0", manifest(lambda m: _lengths(m, -8)), MANIFEST + r"episode_lengths\[0\] = 0 is out of range"),
    (
        "episode_lengths 4.9",
        shard0(lambda s: s["episode_lengths"].__setitem__(0, 4.9)),
        r"episode_lengths\[0\] = 4\.9 is not an integer",
    ),
    (
        "episode_lengths short",
        shard0(lambda s: s["episode_lengths"].pop()),
        MANIFEST + r"shards\[0\]: 1 episode_lengths for 2 episodes",
    ),
    ("frames true", shard0(lambda s: put(s, frames=True)), MANIFEST + r"shards\[0\]\.frames = True is not an integer"),
    (
        "bytes +1",
        shard0(lambda s: put(s, bytes=s["bytes"] + 1)),
        MANIFEST + r"totals\.bytes = \d+, the shards add up to",
    ),
    (
        "sha256 other",
        shard0(lambda s: put(s, sha256="0" * 64)),
        SIDECAR + r"describes shard-000000\.tar .* the manifest",
    ),
    (
        "shard listed twice",
        manifest(lambda m: m["shards"].append(dict(m["shards"][0]))),
        MANIFEST + "two records share one index",
    ),
    ("shard dropped", manifest(lambda m: m["shards"].pop()), MANIFEST + r"episodes \[2\] .* are in no shard"),
    ("shards reordered", manifest(lambda m: m["shards"].reverse()), HARMLESS),
    ("shard index 10^12", shard0(lambda s: put(s, index=10**12)), HARMLESS),
    ("shard name escapes", shard0(lambda s: put(s, name="../x.tar")), MANIFEST + r"shards\[0\]\.name = '\.\./x\.tar'"),
    (
        "sidecar name of no file",
        shard0(lambda s: put(s, sidecar="nope.idx.json")),
        r"nope\.idx\.json: missing, though manifest\.json lists it",
    ),
    (
        "sidecars swapped",
        manifest(_swap_sidecars),
        SIDECAR + r"describes shard-000000\.tar .* the manifest shard-000001\.tar",
    ),
    (
        "episodes swapped in shard",
        shard0(lambda s: (s["episodes"].reverse(), s["episode_lengths"].reverse())),
        SIDECAR + r"lists episodes \[0, 1\], the manifest \[1, 0\]",
    ),
    (
        "episode listed twice",
        shard0(lambda s: s["episodes"].__setitem__(1, 0)),
        MANIFEST + "episode 0 is also in shards",
    ),
    (
        "episode 99",
        shard0(lambda s: s["episodes"].__setitem__(0, 99)),
        MANIFEST + r"episodes \[99\] .* are not in the source",
    ),
    ("episode '0'", shard0(lambda s: s["episodes"].__setitem__(0, "0")), r"episodes\[0\] = '0' is not an integer"),
    (
        "task renamed",
        manifest(lambda m: m["tasks"].__setitem__(0, "other")),
        r"e00000\d\.json has tasks \['task 0'\] that the manifest's tasks do not list",
    ),
    (
        "tasks swapped",
        manifest(lambda m: m["tasks"].reverse()),
        r"episode \d: its rows' task_index names tasks \['task \d'\], the episode lists",
    ),
    (
        "tasks empty",
        manifest(lambda m: put(m, tasks=[])),
        r"e00000\d\.json has tasks \['task \d'\] that the manifest's tasks do not list",
    ),
    ("task twice", manifest(lambda m: m["tasks"].append(m["tasks"][0])), MANIFEST + "tasks lists a task twice"),
    (
        "feature dropped",
        manifest(lambda m: m["features"].pop(STATE)),
        MANIFEST + r"features .* differ from source_info\.features",
    ),
    (
        "feature dropped with source_info",
        manifest(_drop_feature),
        r"shard-\d+\.idx\.json: episodes\[0\] \(episode \d\): stats for \['observation\.state'\], which are not features",
    ),  # the sidecars' episode stats still name it
    (
        "feature added with source_info",
        manifest(_add_feature),
        r"episode \d: feature 'observation\.extra' has no column",
    ),
    (
        "feature shape [99] with source_info",
        both(lambda f: put(f, shape=[99])),
        r"episode \d: column 'observation\.state' holds 6 value\(s\) per frame, its feature's shape \[99\]",
    ),
    (
        "feature shape [-1] with source_info",
        both(lambda f: put(f, shape=[-1])),
        MANIFEST + r"features\['observation\.state'\]: shape = \[-1\]",
    ),
    (
        "feature dtype int8 with source_info",
        both(lambda f: put(f, dtype="int8")),
        r"column 'observation\.state' holds float values, its feature's dtype is int8",
    ),
    (
        "camera shape 10^6 x 10^6",
        both(lambda f: put(f, shape=[10**6, 10**6, 3]), CAMS[0]),
        r"shape = \[1000000, 1000000, 3\] is not a list of positive sizes",
    ),
    (
        "camera dropped",
        manifest(lambda m: put(m, cameras=m["cameras"][:1])),
        MANIFEST + r"cameras = .* are not the video features",
    ),
    (
        "camera dropped everywhere",
        manifest(_drop_camera),
        r"shard-00000\d\.idx\.json: episodes\[0\] .* clips for .* the manifest's cameras are",
    ),
    (
        "cameras reordered",
        manifest(lambda m: m["cameras"].reverse()),
        MANIFEST + r"cameras = .* are not the video features",
    ),
    (
        "total_episodes 2",
        manifest(lambda m: m["source_info"].update(total_episodes=2)),
        MANIFEST + r"episodes \[2\] of source_info\.total_episodes = 2 are not in the source",
    ),
    (
        "total_episodes 10^12",
        manifest(lambda m: m["source_info"].update(total_episodes=10**12)),
        MANIFEST + r"episodes \[3, 4, .*\] of source_info\.total_episodes = 10+ are in no shard",
    ),
    (
        "totals.frames",
        manifest(lambda m: m["totals"].update(frames=1)),
        MANIFEST + r"totals\.frames = 1, the shards add up to",
    ),
    (
        "skipped yet present",
        manifest(lambda m: put(m, skipped_episodes={"0": "bad"})),
        MANIFEST + "episode 0 is also recorded as skipped",
    ),
    (
        "skipped key 'x'",
        manifest(lambda m: put(m, skipped_episodes={"x": "bad"})),
        MANIFEST + r"skipped_episodes key 'x' = 'x' is not an integer",
    ),
    (
        "format_version '3'",
        manifest(lambda m: put(m, format_version="3")),
        MANIFEST + r"format_version '3' is not supported",
    ),
    (
        "format_version 2",
        manifest(lambda m: put(m, format_version=2)),
        MANIFEST + r"format_version 2 carries no digests of its metadata .* legacy_format=True",
    ),
    ("manifest a list", lambda r: (r / "manifest.json").write_text("[]"), MANIFEST + "not a lerobot-shards file"),
    (
        "manifest nested 10^5 deep",
        lambda r: (r / "manifest.json").write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        MANIFEST + "nested too deeply to be a lerobot-shards file",
    ),
    ("manifest a directory", lambda r: _to_dir(r / "manifest.json"), MANIFEST + "not a regular file"),
    ("sidecar: pts swapped", sidecar(_swap_pts), SIDECAR + r"frames\.pts is not strictly increasing"),
    (
        "sidecar: frame table short",
        sidecar(lambda e: e["clips"][CAMS[0]]["frames"]["pts"].pop()),
        SIDECAR + r"frames\.pts does not hold num_frames",
    ),
    (
        "sidecar: num_frames 10^9",
        sidecar(lambda e: put(e["clips"][CAMS[0]], num_frames=10**9)),
        SIDECAR + r"num_frames = 1000000000 is out of range",
    ),
    (
        "sidecar: camera members swapped",
        sidecar(_swap_camera_members),
        r"shard-000000\.tar: episode 0: the sidecar puts member e000000\.observation\.images\.top\.mp4 .* where the tar holds e000000\.observation\.images\.front\.mp4",
    ),
    (
        "sidecar: member offset +1",
        sidecar(lambda e: put(e["members"][0], offset=e["members"][0]["offset"] + 1)),
        r"shard-000000\.tar: episode 0: member e000000\.json .* has checksum",
    ),
    (
        "sidecar: member offset 10^12",
        sidecar(lambda e: put(e["members"][0], offset=10**12)),
        SIDECAR + r"member e000000\.json at 1000000000000\+\d+ lies outside",
    ),
    (
        "sidecar: episode length 10^9",
        sidecar(lambda e: put(e, length=10**9)),
        SIDECAR + r"episodes\[0\]\.length = 1000000000 is out of range",
    ),
    (
        "sidecar: episode index",
        sidecar(lambda e: put(e, episode_index=1)),
        SIDECAR + r"lists episodes \[1, 1\], the manifest \[0, 1\]",
    ),
    (
        "sidecar: clip dropped",
        sidecar(lambda e: e["clips"].pop(CAMS[1])),
        SIDECAR + r"clips for \['observation\.images\.front'\]",
    ),
    ("sidecar: a list", lambda r: (r / SIDE0).write_text("[]"), SIDECAR + "not a lerobot-shards file"),
    ("sidecar: missing", lambda r: (r / SIDE0).unlink(), SIDECAR + "missing, though manifest.json lists it"),
    ("sidecar: a FIFO", lambda r: _fifo(r / SIDE0), SIDECAR + "not a regular file"),
    ("shard: missing", lambda r: (r / TAR0).unlink(), r"shard-000000\.tar: missing, though manifest\.json lists it"),
    ("shard: truncated", lambda r: _truncate(r / TAR0), r"shard-000000\.tar: episode \d: shard is truncated"),
    ("shard: a directory", lambda r: _to_dir(r / TAR0), r"shard-000000\.tar: not a regular file"),
    ("shard: a FIFO", lambda r: _fifo(r / TAR0), r"shard-000000\.tar: not a regular file"),
]

INFO = r"meta/info\.json: .*"
EPS = r"meta/episodes/chunk-000/file-000\.parquet: episode 0: .*"
DATA = r"data/chunk-000/file-000\.parquet: episode 0: .*"
MP4RE = r"videos/observation\.images\.front/chunk-000/file-000\.mp4: "

RAW: list[tuple[str, Edit, str | None]] = [
    ("fps 0", info(lambda d: put(d, fps=0)), INFO + "fps = 0 is not a frame rate"),
    ("fps inf", info(lambda d: put(d, fps=math.inf)), INFO + "fps = inf is not a frame rate"),
    ("fps nan", info(lambda d: put(d, fps=math.nan)), INFO + "fps = nan is not a frame rate"),
    ("fps -30", info(lambda d: put(d, fps=-30)), INFO + "fps = -30 is not a frame rate"),
    ("fps 1e9", info(lambda d: put(d, fps=1e9)), INFO + r"fps = 1000000000\.0 is not a frame rate"),
    ("fps '30'", info(lambda d: put(d, fps="30")), INFO + "fps = '30' is not a frame rate"),
    ("fps true", info(lambda d: put(d, fps=True)), INFO + "fps = True is not a frame rate"),
    (
        "fps x2",
        info(lambda d: put(d, fps=60)),
        MP4RE + r"episode \d camera observation\.images\.front: the mp4 holds 15 frames over 0\.5000 s \(30 fps\), "
        r"but meta/info\.json has fps = 60",
    ),
    (
        "fps /2, video.fps too",  # the files play at 30: rows at 15 fps reach into the next episode's frames
        info(fps_everywhere(15)),
        MP4RE + r"episode 0 field videos/observation\.images\.front/from_timestamp = 0\.0000 s: its 8 rows "
        r"\(field 'length'\) would take frames 0\.\.7 at meta/info\.json's fps 15, which overlap episode 1's frames",
    ),
    ("features missing", info(lambda d: d.pop("features")), INFO + "missing field 'features'"),
    (
        "info nested 10^5 deep",
        lambda r: (r / "meta/info.json").write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        INFO + "nested too deeply to be a metadata file",
    ),
    ("features a list", info(lambda d: put(d, features=[])), INFO + "features is not an object of feature specs"),
    ("feature dropped", info(lambda d: d["features"].pop(STATE)), HARMLESS),  # as LeRobot: the column is not read
    (
        "feature added",
        info(lambda d: d["features"].update(extra={"dtype": "float32", "shape": [2]})),
        r"feature\(s\) 'extra' declared in meta/info\.json have no column",
    ),
    (
        "state shape [99]",
        state(lambda f: put(f, shape=[99])),
        DATA + r"column 'observation\.state' holds 6 value\(s\) per frame, its feature's shape \[99\]",
    ),
    (
        "state shape [-1]",
        state(lambda f: put(f, shape=[-1])),
        INFO + r"feature 'observation\.state': shape = \[-1\] is not a list of positive sizes",
    ),
    ("state shape [10^12]", state(lambda f: put(f, shape=[10**12])), INFO + r"shape = \[1000000000000\] is not a list"),
    ("state shape missing", state(lambda f: f.pop("shape")), INFO + "shape = None is not a list"),
    (
        "state dtype int8",
        state(lambda f: put(f, dtype="int8")),
        DATA + r"column 'observation\.state' holds float values, its feature's dtype is int8",
    ),
    (
        "state dtype unknown",
        state(lambda f: put(f, dtype="complex")),
        INFO + "feature 'observation.state' has unknown dtype 'complex'",
    ),
    (
        "camera shape 10^6 x 10^6",
        info(lambda d: put(d["features"][CAMS[0]], shape=[10**6, 10**6, 3])),
        INFO + "shape = .* is not a list of positive sizes",
    ),
    (
        "camera added",
        info(lambda d: d["features"].update({"observation.images.x": d["features"][CAMS[0]]})),
        EPS + r"missing field\(s\) videos/observation\.images\.x/",
    ),
    (
        "total_episodes 2",
        info(lambda d: put(d, total_episodes=2)),
        r"meta/episodes: has episodes \[2\], but meta/info\.json has total_episodes = 2",
    ),
    (
        "total_episodes 10^12",
        info(lambda d: put(d, total_episodes=10**12)),
        r"meta/episodes: lacks episodes \[3, 4, .*total_episodes = 10+",
    ),
    ("total_episodes -1", info(lambda d: put(d, total_episodes=-1)), INFO + "total_episodes = -1 is not a count"),
    ("data_path escapes", info(lambda d: put(d, data_path="../{chunk_index}.parquet")), INFO + "field 'data_path'"),
    (  # a width is bounded before it is used: formatted, this one is 900 MB
        "data_path width 9e8",
        info(lambda d: put(d, data_path="data/chunk-{chunk_index:0900000000d}/file-{file_index:03d}.parquet")),
        INFO + r"field 'data_path' = .*: \{chunk_index:0900000000d\} is not a path template's field \(format widths up",
    ),
    (
        "video_path nested width",
        info(lambda d: put(d, video_path="videos/{video_key}/{chunk_index:{file_index}}.mp4")),
        INFO + r"field 'video_path' = .* is not a path template's field",
    ),
    ("video_path null", info(lambda d: put(d, video_path=None)), INFO + "is a video but video_path is null"),
    ("info a list", lambda r: (r / "meta/info.json").write_text("[]"), INFO + r"not a JSON object \(a JSON list\)"),
    ("info a directory", lambda r: _to_dir(r / "meta/info.json"), INFO + "not a regular file"),
    ("info a FIFO", lambda r: _fifo(r / "meta/info.json"), INFO + "not a regular file"),
    ("stats a list", lambda r: (r / "meta/stats.json").write_text("[]"), r"meta/stats\.json: not a JSON object"),
    ("stats missing", lambda r: (r / "meta/stats.json").unlink(), HARMLESS),
    (
        "episodes: row missing",
        rows(EPISODES, lambda rs: rs[1:]),
        r"meta/episodes: lacks episodes \[0\], but meta/info\.json has total_episodes = 3",
    ),
    ("episodes: row twice", rows(EPISODES, lambda rs: [rs[0], *rs]), r"meta/episodes: episode 0 is listed twice"),
    ("episodes: rows out of order", rows(EPISODES, lambda rs: rs[::-1]), HARMLESS),
    ("episodes: none", rows(EPISODES, lambda rs: []), r"meta/episodes: lacks episodes \[0, 1, 2\]"),
    (
        "episodes: length 10^9",
        rows(EPISODES, length(10**9)),
        EPS + r"field 'length' = 1000000000 is not an integer in \[1, 10000000\]",
    ),
    (
        "episodes: length 10^6",
        rows(EPISODES, length(10**6)),
        MP4RE
        + r"episode 0 .* its 1000000 rows \(field 'length'\) would take frames 0\.\.999999 .* overlap episode 1's",
    ),
    ("episodes: length 0", rows(EPISODES, length(0)), EPS + "field 'length' = 0 is not an integer in"),
    ("episodes: length nan", rows(EPISODES, length(math.nan)), EPS + "field 'length' = nan is not an integer in"),
    (
        "episodes: length 4.9",
        rows(EPISODES, length(4.9)),
        EPS + "length is 4 but dataset_from_index..dataset_to_index spans 8 rows",
    ),
    (
        "episodes: length lowered",
        rows(EPISODES, length(5)),
        r"data/chunk-000/file-000\.parquet: row index 5 also belongs to episode 0",
    ),
    (
        "episodes: length raised",
        rows(EPISODES, length(9)),
        MP4RE + r"episode 0 .* its 9 rows \(field 'length'\) would take frames 0\.\.8 .* overlap episode 1's",
    ),
    ("episodes: length null", rows(EPISODES, first("length", None)), EPS + "missing field 'length'"),
    (
        "episodes: index -1",
        rows(EPISODES, first("episode_index", -1)),
        r"episode -1: field 'episode_index' = -1 is not an integer",
    ),
    (
        "episodes: index nan",
        rows(EPISODES, first("episode_index", math.nan)),
        r"field 'episode_index' = nan is not an integer",
    ),
    ("episodes: from_index shifted", rows(EPISODES, _shift(3)), r"rows index 3\.\.10 should belong to episode 0"),
    ("episodes: from_index -5", rows(EPISODES, _shift(-5)), EPS + r"field 'dataset_from_index' = -5 is not an integer"),
    (
        "episodes: from_timestamp nan",
        rows(EPISODES, first(f"videos/{CAMS[0]}/from_timestamp", math.nan)),
        EPS + r"from_timestamp' = nan is not a finite number",
    ),
    (
        "episodes: from_timestamp inf",
        rows(EPISODES, first(f"videos/{CAMS[0]}/from_timestamp", math.inf)),
        EPS + r"from_timestamp' = inf is not a finite number",
    ),
    (
        "episodes: from_timestamp 1e9",
        rows(EPISODES, first(f"videos/{CAMS[0]}/from_timestamp", 1e9)),
        MP4RE + r"episode 0 field videos/observation\.images\.front/from_timestamp = 1000000000\.0000 s plus its 8 "
        r"rows ends at .* outside the video",
    ),
    (  # off the frame grid by more than half a frame: its rows would take episode 1's first frame
        "episodes: from_timestamp + 0.6 frame",
        rows(EPISODES, clip_moved(0, 0.6)),
        MP4RE + r"episode 0 field videos/observation\.images\.front/from_timestamp = 0\.0200 s: its 8 rows "
        r"\(field 'length'\) would take frames 1\.\.8 .* overlap episode 1's frames",
    ),
    (  # within half a frame: the nearest frame is the episode's, as the converter reads it
        "episodes: from_timestamp + 0.3 frame",
        rows(EPISODES, clip_moved(1, 0.3)),
        HARMLESS,
    ),
    (
        "episodes: video file 7",
        rows(EPISODES, first(f"videos/{CAMS[0]}/file_index", 7)),
        r"missing file\(s\): videos/observation\.images\.front/chunk-000/file-007\.mp4 \(first needed by episode 0\)",
    ),
    (
        "episodes: chunk -1",
        rows(EPISODES, first("data/chunk_index", -1)),
        EPS + r"field 'data/chunk_index' = -1 is not an integer",
    ),
    (
        "episodes: tasks unknown",
        rows(EPISODES, first("tasks", ["no such task"])),
        HARMLESS,
    ),  # frames' tasks come from task_index
    (
        "episodes: not parquet",
        lambda r: (r / EPISODES).write_bytes(b"PAR1garbage"),
        r"file-000\.parquet: not a readable parquet file",
    ),
    ("tasks: missing", lambda r: (r / "meta/tasks.parquet").unlink(), r"meta/tasks\.parquet: file not found"),
    ("tasks: none", rows("meta/tasks.parquet", lambda rs: []), r"meta/tasks\.parquet: no tasks"),
    (
        "tasks: one dropped",
        rows("meta/tasks.parquet", lambda rs: rs[:1]),
        r"episode 1: task_index 1 is not a task \(the dataset has 1 tasks\)",
    ),
    (
        "tasks: index twice",
        rows("meta/tasks.parquet", every("task_index", 0)),
        r"meta/tasks\.parquet: task_index 0 of task 'task 1' is out of range or repeated",
    ),
    (
        "tasks: index null",
        rows("meta/tasks.parquet", first("task_index", None)),
        r"meta/tasks\.parquet: task_index None of task 'task 0'",
    ),
    (
        "tasks: name null",
        rows("meta/tasks.parquet", first("__index_level_0__", None)),
        r"meta/tasks\.parquet: task 0 is None, not a string",
    ),
    (
        "data: task_index 2",
        rows(DATA0, every("task_index", 2)),
        DATA + r"task_index 2 is not a task \(the dataset has 2 tasks\)",
    ),
    ("data: task_index -1", rows(DATA0, every("task_index", -1)), DATA + r"task_index -1 is not a task"),
    (
        "data: episode_index",
        rows(DATA0, first("episode_index", 2)),
        r"should belong to episode 0 but field 'episode_index' holds 2",
    ),
    ("data: index gap", rows(DATA0, lambda rs: put(rs[3], index=100)), r"column 'index' is not contiguous"),
    (
        "data: row dropped",
        rows(DATA0, lambda rs: rs[:-1]),
        r"episode 1 has length 7 in meta/episodes but the file holds 6 of its rows",
    ),
    (
        "data: frame_index",
        rows(DATA0, lambda rs: put(rs[2], frame_index=99)),
        DATA + r"column 'frame_index' holds 99 at row 2, expected 2",
    ),
    (  # LeRobot decodes at the row's timestamp, we by position: the two must agree (tolerance_s)
        "data: timestamp nan",
        rows(DATA0, lambda rs: put(rs[2], timestamp=math.nan)),
        DATA + r"row 2: timestamp nan s is not frame_index 2 / fps 30",
    ),
    (
        "data: timestamps swapped",
        rows(
            DATA0,
            lambda rs: (
                [put(a, timestamp=b["timestamp"]) for a, b in ((rs[1], dict(rs[2])), (rs[2], dict(rs[1])))] and None
            ),
        ),
        DATA + r"row 1: timestamp 0\.0666\d* s is not frame_index 1 / fps 30 = 0\.033333 s",
    ),
    (
        "data: timestamps doubled",
        rows(DATA0, lambda rs: [put(r, timestamp=2 * r["timestamp"]) for r in rs] and None),
        DATA + r"row 1: timestamp 0\.0666\d* s is not frame_index 1",
    ),
    (
        "data: timestamps half a frame late",
        rows(DATA0, lambda rs: [put(r, timestamp=r["timestamp"] + 0.5 / 30) for r in rs] and None),
        DATA + r"row 0: timestamp 0\.01666\d* s is not frame_index 0",
    ),
    (
        "data: timestamps within tolerance",
        rows(DATA0, lambda rs: [put(r, timestamp=r["timestamp"] + 5e-5) for r in rs] and None),
        HARMLESS,
    ),
    (
        "tasks: one string twice",
        rows("meta/tasks.parquet", lambda rs: put(rs[1], __index_level_0__=rs[0]["__index_level_0__"])),
        r"meta/tasks\.parquet: task '[^']+' is listed twice \(task_index 0 and 1\)",
    ),
    ("data: state null", rows(DATA0, _pop(STATE)), DATA + r"column 'observation\.state' has 8 null value\(s\)"),
    (
        "data: state width 3",
        rows(DATA0, lambda rs: [put(r, **{STATE: r[STATE][:3]}) for r in rs] and None),
        DATA + r"column 'observation\.state' holds 3 value\(s\) per frame, its feature's shape \[6\] says 6",
    ),
    (
        "data: not parquet",
        lambda r: (r / DATA0).write_bytes(b"garbage"),
        r"file-000\.parquet: not a readable parquet file",
    ),
    (
        "video: garbage",
        lambda r: (r / MP4).write_bytes(b"\0" * 1000),
        r"episode \d: .*" + MP4RE + r"not a readable mp4 with a video stream",
    ),
    (
        "video: missing",
        lambda r: (r / MP4).unlink(),
        r"missing file\(s\): videos/observation\.images\.front/chunk-000/file-000\.mp4",
    ),
]


def _reseal(root: Path) -> None:
    """``reseal``, unless the edit left no manifest object to reseal (a list, a directory, one too deep)."""
    try:
        reseal(root)
    except (TypeError, IsADirectoryError, RecursionError):
        pass


def _outcome(root: Path, expected: str | None, clean: list[tuple[int, int]]) -> None:
    if expected is HARMLESS:
        assert _epoch(root) == clean
        return
    with pytest.raises(LeRobotShardsError) as raised:
        _epoch(root)
    text = str(raised.value)
    assert "\n" not in text and "check that the storage server is up" not in text, text
    assert str(root) in text, f"names no file of the dataset: {text}"
    assert re.search(expected, text), text


# Sidecar files the loader does not read when the conversion has its sidecar pack (it reads their
# slices of the pack, which these edits leave as they were): harmless to the loader there, found by
# ``verify``, and refused by a loader reading the files (a conversion without the pack, case 2).
PACKED_AWAY = {"sidecar name of no file", "sidecar: missing", "sidecar: a FIFO"}

CASES = (
    [pytest.param(1, e, HARMLESS if i in PACKED_AWAY else x, id=f"converted: {i}") for i, e, x in CONVERTED]
    + [pytest.param(2, e, x, id=f"converted without its pack: {i}") for i, e, x in CONVERTED if i in PACKED_AWAY]
    + [pytest.param(0, e, x, id=f"raw: {i}") for i, e, x in RAW]
)


@pytest.mark.parametrize(("which", "edit", "expected"), CASES)
def test_metadata_edit(
    which: int, edit: Edit, expected: str | None, datasets: tuple[Path, Path], clean: list, tmp_path: Path
) -> None:
    """A converted dataset's edit runs with the digests recomputed, so that the deeper checks must refuse it."""
    root = tmp_path / "dataset"
    shutil.copytree(datasets[min(which, 1)], root)
    if which == 2:
        unpack(root)
    edit(root)
    if which >= 1:
        _reseal(root)
    _outcome(root, expected, clean)


@pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="known gap, docs/guarantees.md: resealed pts that stay increasing"
)
def test_a_shifted_pts_with_digests_recomputed(datasets: tuple[Path, Path], tmp_path: Path) -> None:
    """The loader trusts a frame table its digests vouch for: frame 2 then decodes as frame 3 (the
    identity check in ``_epoch`` fails); ``verify`` finds it by demuxing every clip."""
    root = tmp_path / "converted"
    shutil.copytree(datasets[1], root)
    sidecar(lambda e: e["clips"][CAMS[0]]["frames"]["pts"].__setitem__(2, e["clips"][CAMS[0]]["frames"]["pts"][2] + 1))(
        root
    )
    reseal(root)
    assert not verify_dataset(root).ok
    with pytest.raises(LeRobotShardsError):
        _epoch(root)


def test_verify_reports_each_converted_case_without_raising(datasets: tuple[Path, Path], tmp_path: Path) -> None:
    """Every converted case the loader refuses, ``verify --source`` reports as FAILED (it never raises
    nor hangs on one); the harmless ones verify OK, but for the feature dropped from both the
    features and the kept source info, which only the source can tell."""
    for name, edit, expected in CONVERTED:
        root = tmp_path / re.sub(r"\W+", "_", name)
        shutil.copytree(datasets[1], root)
        edit(root)
        _reseal(root)
        report = verify_dataset(root, datasets[0])
        assert report.ok == (expected is HARMLESS and name not in PACKED_AWAY), (
            name,
            report.problems,
        )
        shutil.rmtree(root)


def test_tasks_renamed_in_tasks_parquet_alone_convert_as_lerobot_reads_them(
    datasets: tuple[Path, Path], tmp_path: Path, caplog
) -> None:
    """A typo fixed in meta/tasks.parquet only (meta/episodes' ``tasks`` still name the old strings):
    LeRobot gives frames the strings at their task_index, and so do the raw loader and the conversion,
    which says so once, verifies against its source and loads with the same tasks as the raw folder."""
    raw = Path(shutil.copytree(datasets[0], tmp_path / "raw"))
    rows("meta/tasks.parquet", lambda rs: [put(r, __index_level_0__=f"fixed {r['task_index']}") for r in rs] and None)(
        raw
    )
    with caplog.at_level("WARNING", logger="lerobot_shards"):
        convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=2), progress=False)
    assert any("3 of 3 episodes (first: episode 0) list tasks" in r.getMessage() for r in caplog.records)
    report = verify_dataset(tmp_path / "out", raw)
    assert report.ok, report.problems

    def tasks(root: Path) -> set[tuple[int, str]]:
        return {(int(s["task_index"]), s["task"]) for s in EpisodePoolDataset(str(root), seed=0)}

    assert tasks(tmp_path / "out") == tasks(raw) == {(0, "fixed 0"), (1, "fixed 1")}
