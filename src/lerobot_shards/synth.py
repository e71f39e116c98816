"""Synthetic LeRobot v3.0 datasets whose every frame and vector names its own (episode, frame).

Tests of the converter and the loader need datasets of any shape (many files, many chunks, no
video, AV1 or H.264, drifting timestamps) and a way to prove that the frame a loader returned is
the frame it was asked for. Each image paints its identity as bright/dark bands, the way the
real fixture ``so101_record_test`` does, and ``observation.state``/``action`` carry it as numbers.
The layout mirrors what LeRobot 0.4 writes, parquet schemas included.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import multiprocessing as mp
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .depth import DEPTH_QMAX, DepthParams
from .format import CODECS, TMP_SUFFIX, FrameTransform
from .language import LANGUAGE_COLUMNS, LANGUAGE_DTYPE, LANGUAGE_EVENTS, LANGUAGE_PERSISTENT, ROW_FIELDS
from .resize import map_box
from .video import HEVC_MIN_SIDE, concat_clips, encode_depth_video, encode_video

IDENTITY_BITS = 20  # bands painted per frame: frame_bits of the frame index, the rest the episode's
FIXTURE_BITS = (10, 6)  # (frame_bits, episode_bits) of the real so101_record_test fixture

DARK, BRIGHT = 25, 230
_CAMERA_TINTS = ((200, 60, 60), (60, 200, 60), (60, 60, 200), (200, 200, 60), (200, 60, 200), (60, 200, 200))
JOINT_NAMES = (
    "shoulder_pan.pos",
    "shoulder_lift.pos",
    "elbow_flex.pos",
    "wrist_flex.pos",
    "wrist_roll.pos",
    "gripper.pos",
)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STATS_SAMPLE_FRAMES = 100  # LeRobot computes image stats on about 100 frames per episode
_DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
VECTOR_KEYS = ("action", "observation.state")
TEXTURES = ("flat", "realistic")
SHAKE_MARGIN = 16  # pixels of scene beyond each edge, so a shaken camera never sees past it
REALISTIC_AMPLITUDE = 30.0  # grey levels per unit of scene texture: ~21 KB per 480p AV1 frame


# ---------------------------------------------------------------- identity painting


def _band_edges(width: int, num_bands: int) -> list[int]:
    if width < num_bands:
        raise ValueError(f"width {width} is narrower than the {num_bands} identity bands")
    return [i * width // num_bands for i in range(num_bands + 1)]


def paint_identity(
    episode_index: int,
    frame_index: int,
    height: int,
    width: int,
    camera_index: int = 0,
    *,
    frame_bits: int = 10,
    episode_bits: int = 10,
    texture: str = "flat",
    seed: int = 0,
) -> np.ndarray:
    """HxWx3 uint8 RGB frame that ``read_identity`` maps back to (episode_index, frame_index).

    Lower two thirds: one band per bit (frame bits first), bright when set. Top sixth: a tint per
    camera, so mixed-up cameras show. Between: deterministic texture, so clips compress like
    images rather than flat colour and the encoder does real work.

    ``texture="realistic"`` lays a shaking multi-scale scene under the whole frame (see
    ``_realistic_scene``) so encoded frames weigh what real robot footage does; ``"flat"`` frames
    compress about 100x better than real footage and hide bandwidth and seek costs.
    """
    if not 0 <= frame_index < 2**frame_bits:
        raise ValueError(f"frame_index {frame_index} does not fit in frame_bits={frame_bits}")
    if not 0 <= episode_index < 2**episode_bits:
        raise ValueError(f"episode_index {episode_index} does not fit in episode_bits={episode_bits}")
    if height < 6:
        raise ValueError(f"height {height} is too small for the identity layout (>= 6)")
    edges = _band_edges(width, frame_bits + episode_bits)
    bits = [(frame_index >> i) & 1 for i in range(frame_bits)] + [(episode_index >> j) & 1 for j in range(episode_bits)]
    img = np.empty((height, width, 3), np.uint8)
    band_top, tint_bottom = height // 3, height // 6
    for bit, (lo, hi) in zip(bits, zip(edges, edges[1:])):
        img[band_top:, lo:hi] = BRIGHT if bit else DARK
    img[:tint_bottom] = _CAMERA_TINTS[camera_index % len(_CAMERA_TINTS)]
    y = np.arange(tint_bottom, band_top, dtype=np.float32)[:, None, None] / 16.0
    x = np.arange(width, dtype=np.float32)[None, :, None] / 24.0
    phase = np.array([0.0, 2.1, 4.2], np.float32) + 0.37 * episode_index + 0.9 * camera_index
    wave = 128 + 60 * np.sin(x + frame_index / 5.0 + phase) * np.cos(y + phase)
    noise = np.random.default_rng([episode_index, frame_index, camera_index]).integers(-16, 17, wave.shape)
    img[tint_bottom:band_top] = np.clip(wave + noise, 0, 255).astype(np.uint8)
    if texture == "realistic":
        dy, dx = _shake(seed, episode_index, camera_index, frame_index)
        scene = _realistic_scene(seed, episode_index, camera_index, height, width)
        m = SHAKE_MARGIN
        under = scene[m + dy : m + dy + height, m + dx : m + dx + width]
        # = np.clip(img + under, 0, 255).astype(np.uint8), bit for bit, at half the cost: one
        # cast of the uint8 frame, then in-place float ops instead of a mixed-type add's buffers
        summed = img.astype(under.dtype)
        summed += under
        img = np.clip(summed, 0, 255, out=summed).astype(np.uint8)
    elif texture != "flat":
        raise ValueError(f"texture {texture!r} is not one of {TEXTURES}")
    return img


def _smooth_noise(rng: np.random.Generator, height: int, width: int, cell: int) -> np.ndarray:
    """Gaussian noise on a grid of ``cell`` pixels, bilinearly interpolated to height x width."""
    grid = rng.standard_normal((height // cell + 2, width // cell + 2)).astype(np.float32)
    ys, xs = np.arange(height, dtype=np.float32) / cell, np.arange(width, dtype=np.float32) / cell
    y0, x0 = ys.astype(np.intp), xs.astype(np.intp)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


@functools.lru_cache(maxsize=4)
def _realistic_scene(seed: int, episode: int, camera: int, height: int, width: int) -> np.ndarray:
    """Signed float64 (H+2m)x(W+2m)x3 texture for one camera's episode, cached across its frames.

    Octaves from 64-pixel blobs down to 2-pixel grain, tinted per episode, scaled by
    ``REALISTIC_AMPLITUDE``. Measured at 640x480, 30 fps, g=2, crf=30, one thread: AV1 (LeRobot's
    default) ~21 KB per frame (4.8 KB flat), H.264 ~6.4 KB (x264 spends fewer bits at that crf).
    The identity bands (DARK/BRIGHT, 205 apart) stay readable: their band means move by a few
    grey levels, far from the half-way threshold.
    """
    rng = np.random.default_rng([seed, episode, camera, 7])
    h, w = height + 2 * SHAKE_MARGIN, width + 2 * SHAKE_MARGIN
    layers = (amp * _smooth_noise(rng, h, w, cell) for amp, cell in ((1.0, 64), (0.6, 16), (0.4, 4), (0.25, 2)))
    scene = cast(np.ndarray, sum(layers))
    scene *= REALISTIC_AMPLITUDE / scene.std()
    colour = rng.uniform(0.5, 1.0, 3).astype(np.float32)
    return scene[..., None] * colour


def _shake(seed: int, episode: int, camera: int, frame: int) -> tuple[int, int]:
    """(dy, dx) camera offset at a frame: a slow sway plus a fast tremor, within ``SHAKE_MARGIN``."""
    phase = np.random.default_rng([seed, episode, camera, 8]).uniform(0, 2 * np.pi, (2, 2))
    t = 2 * np.pi * frame
    offset = 0.6 * SHAKE_MARGIN * np.sin(t / 90 + phase[0]) + 0.3 * SHAKE_MARGIN * np.sin(t / 7 + phase[1])
    return int(round(offset[0])), int(round(offset[1]))


def read_identity(
    frame: Any, *, frame_bits: int = 10, episode_bits: int = 10, transform: FrameTransform | None = None
) -> tuple[int, int]:
    """(episode_index, frame_index) painted in one decoded frame.

    Takes what decoders and the loader return: torch or numpy, CHW or HWC, uint8 or float in
    [0, 1]. Averages the middle half of each band over the lower two thirds, so codec blur at
    band edges cannot flip a bit. A frame stored at another size (``convert --resize``, the
    loader's ``resize``) needs its ``transform``: bands are found where it put them, and a
    band the crop cut away raises ValueError.
    """
    arr = frame.detach().cpu().numpy() if hasattr(frame, "detach") else np.asarray(frame)
    if arr.ndim != 3:
        raise ValueError(f"read_identity wants one frame (3 dims), got shape {arr.shape}")
    if arr.shape[-1] not in (1, 3) and arr.shape[0] in (1, 3):
        arr = arr.transpose(1, 2, 0)
    arr = arr.astype(np.float32) * (255.0 if np.issubdtype(arr.dtype, np.floating) else 1.0)
    luma = arr.mean(axis=2)
    nbits = frame_bits + episode_bits
    if transform is None:
        lower = luma[luma.shape[0] // 3 :]
        edges = _band_edges(lower.shape[1], nbits)
        boxes = [(0, lo + (hi - lo) // 4, lower.shape[0], hi - (hi - lo) // 4) for lo, hi in zip(edges, edges[1:])]
    else:
        if luma.shape != tuple(transform.size):
            raise ValueError(f"frame is {luma.shape}, the transform stores {transform.size}")
        lower, (sh, sw) = luma, transform.source
        edges = _band_edges(sw, nbits)
        boxes = []
        for bit, (lo, hi) in enumerate(zip(edges, edges[1:])):
            inset = (hi - lo) / 4
            top, left, bottom, right = map_box(transform, sh // 3, lo + inset, sh, hi - inset)
            box = (int(np.ceil(top)) + 1, int(np.ceil(left)), int(bottom) - 1, int(right))
            if box[2] <= box[0] or box[3] <= box[1]:
                raise ValueError(f"identity band {bit} is not in the stored frame ({transform.mode} {transform.crop})")
            boxes.append(box)
    bits = [int(lower[t:b, lo:hi].mean() > (DARK + BRIGHT) / 2) for t, lo, b, hi in boxes]
    frame_index = sum(b << i for i, b in enumerate(bits[:frame_bits]))
    episode_index = sum(b << j for j, b in enumerate(bits[frame_bits:]))
    return episode_index, frame_index


def identity_vector(episode_index: int, frame_index: int | np.ndarray) -> np.ndarray:
    """``observation.state`` of a synthetic frame: [e*1000 + f + j/10 for j in 0..5] (action = state + 0.5)."""
    base = episode_index * 1000 + np.asarray(frame_index, np.float64)[..., None]
    return (base + np.arange(len(JOINT_NAMES)) / 10).astype(np.float32)


# Depth cameras: LeRobot's default quantizer, stats recorded in millimetres.
SYNTH_DEPTH = DepthParams(depth_min=0.01, depth_max=10.0, shift=3.5, use_log=True, unit="mm")


def paint_depth(episode_index: int, frame_index: int, height: int, width: int) -> np.ndarray:
    """(H, W) uint16 12-bit depth codes naming (episode, frame): the top half holds ``4 * frame + x % 4``,
    the bottom half ``4 * episode + y % 4`` (each index below 1024). Stored losslessly, they decode
    back exactly, and every code is used by some frame of a long enough episode."""
    if not (0 <= episode_index < 1024 and 0 <= frame_index < 1024):
        raise ValueError(f"paint_depth: episode {episode_index} and frame {frame_index} must be in [0, 1024)")
    y, x = np.mgrid[0:height, 0:width]
    top = 4 * frame_index + x % 4
    bottom = 4 * episode_index + y % 4
    return np.where(y < height // 2, top, bottom).astype(np.uint16)


def read_depth_identity(depth: Any, params: DepthParams = SYNTH_DEPTH, unit: str = "mm") -> tuple[int, int]:
    """(episode_index, frame_index) of one depth frame as the loader returns it ((1, H, W) float32 in
    ``unit``): each value must be exactly what LeRobot's dequantization gives the painted code
    (``depth.dequantize``), and the codes ``paint_depth``'s pattern; else ValueError."""
    import torch

    from .depth import dequantize

    values = depth.detach().cpu() if hasattr(depth, "detach") else torch.as_tensor(depth)
    if values.dtype != torch.float32 or values.ndim != 3 or values.shape[0] != 1:
        raise ValueError(
            f"read_depth_identity wants one (1, H, W) float32 frame, got {values.dtype} {tuple(values.shape)}"
        )
    table = dequantize(torch.arange(DEPTH_QMAX + 1, dtype=torch.int32)[None, :, None], params, unit)[0, :, 0]
    codes = torch.searchsorted(table, values[0].contiguous()).clamp_(max=DEPTH_QMAX)
    if not torch.equal(table[codes], values[0]):
        raise ValueError("read_depth_identity: values that no 12-bit code dequantizes to")
    c = codes.numpy()
    height, width = c.shape
    frame, episode = int(c[0, 0]) // 4, int(c[-1, 0]) // 4
    if not np.array_equal(c, paint_depth(episode, frame, height, width)):
        raise ValueError("read_depth_identity: codes do not follow the painted pattern")
    return episode, frame


# ---------------------------------------------------------------- stats


LANGUAGE_EVERY = 3  # with language=True, every third episode (e % 3 == 2) is left unannotated
EVENT_EVERY = 5  # events fire on frames f % 5 == 2


def language_rows(episode_index: int, frame_index: int, length: int, fps: float) -> dict[str, list[dict[str, Any]]]:
    """The language columns ``synth_dataset(language=True)`` writes on a frame, as LeRobot 0.6.1's
    dataset returns them: the episode's persistent rows (a plan, a subtask per third of the episode
    starting at its timestamp, a unicode task rephrasing) on every frame, and on frames
    ``f % EVENT_EVERY == 2`` an interjection naming (episode, frame) and a ``say`` tool call
    answering it. Episodes ``e % LANGUAGE_EVERY == 2`` have none (empty lists)."""
    e, f = episode_index, frame_index
    if e % LANGUAGE_EVERY == 2:
        return {LANGUAGE_PERSISTENT: [], LANGUAGE_EVENTS: []}
    none = dict.fromkeys(ROW_FIELDS[LANGUAGE_PERSISTENT])

    def at(frame: int) -> float:
        return float(np.float32(frame / fps))

    persistent = [
        {
            **none,
            "role": "assistant",
            "content": f"plan of episode {e}: reach, grasp, place",
            "style": "plan",
            "timestamp": 0.0,
        },
        *(
            {
                **none,
                "role": "assistant",
                "content": f"subtask {k} of episode {e}",
                "style": "subtask",
                "timestamp": at(k * length // 3),
            }
            for k in range(3)
        ),
        {**none, "role": "user", "content": f"épisode {e} ✓ — déplace le cube", "style": "task_aug", "timestamp": 0.0},
    ]
    events: list[dict[str, Any]] = []
    if f % EVENT_EVERY == 2:
        say = {"type": "function", "function": {"name": "say", "arguments": {"text": f"ok {e}/{f}", "n": f}}}
        events = [
            {"role": "assistant", "content": None, "style": None, "camera": None, "tool_calls": [say]},
            {
                "role": "user",
                "content": f"stop at frame {f} of episode {e}",
                "style": "interjection",
                "camera": None,
                "tool_calls": None,
            },
        ]
    return {LANGUAGE_PERSISTENT: persistent, LANGUAGE_EVENTS: events}


def _language_type(column: str) -> pa.DataType:
    """LeRobot's row struct, ``tool_calls`` as JSON text (what its ``Json`` feature stores)."""
    types = {"timestamp": pa.float32(), "tool_calls": pa.list_(pa.string())}
    return pa.list_(pa.struct([(f, types.get(f, pa.string())) for f in ROW_FIELDS[column]]))


def _stored_language(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**r, "tool_calls": None if r["tool_calls"] is None else [json.dumps(c) for c in r["tool_calls"]]} for r in rows
    ]


def _episode_stats(values: np.ndarray, *, image: bool = False, depth: bool = False) -> dict[str, np.ndarray]:
    """min/max/mean/std/count/quantiles as LeRobot stores them: per dim, or per channel (3,1,1) for images.

    Images are subsampled by a stride as LeRobot's ``auto_downsample_height_width`` does (sides of
    300 pixels and more to about 150), which also keeps large synthetic datasets quick to write.
    """
    channels = 1 if depth else 3  # a depth map (N, H, W, 1) keeps its unit: no scaling to [0, 1]
    if image or depth:
        height, width = values.shape[1:3]
        if max(height, width) >= 300:
            step = int(max(height, width) / 150)
            values = values[:, ::step, ::step]
        v = values.reshape(-1, channels).astype(np.float64) / (1.0 if depth else 255.0)  # (N*H*W, C)
    else:
        v = values.reshape(len(values), -1)
        v = v if np.issubdtype(v.dtype, np.integer) else v.astype(np.float64)
    shape = (channels, 1, 1) if image or depth else (v.shape[1],)
    stats = {
        "min": v.min(axis=0).reshape(shape),
        "max": v.max(axis=0).reshape(shape),
        "mean": v.mean(axis=0, dtype=np.float64).reshape(shape),
        "std": v.std(axis=0, dtype=np.float64).reshape(shape),
        "count": np.array([len(values)]),
    }
    quantiles = np.quantile(v, list(QUANTILES.values()), axis=0)  # one partition for all, same values
    for name, value in zip(QUANTILES, quantiles):
        stats[name] = value.reshape(shape)
    return stats


def _aggregate(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset stats from episode stats, as LeRobot's aggregate_stats combines them."""
    counts = np.array([s["count"][0] for s in per_episode], np.float64)
    w = counts / counts.sum()

    def wsum(key: str) -> np.ndarray:
        return sum(wi * s[key] for wi, s in zip(w, per_episode))

    mean = wsum("mean")
    var = sum(wi * (s["std"] ** 2 + (s["mean"] - mean) ** 2) for wi, s in zip(w, per_episode))
    out = {
        "min": np.min([s["min"] for s in per_episode], axis=0),
        "max": np.max([s["max"] for s in per_episode], axis=0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": np.array([int(counts.sum())]),
    }
    out.update({name: wsum(name) for name in QUANTILES})
    return out


def _stats_type(stat: str, dtype: str) -> pa.DataType:
    if stat == "count":
        return pa.list_(pa.field("element", pa.int64()))
    elem = pa.int64() if stat in ("min", "max") and dtype == "int64" else pa.float64()
    if dtype in ("video", "image"):
        for _ in range(3):
            elem = pa.list_(pa.field("element", elem))
        return elem
    return pa.list_(pa.field("element", elem))


# ---------------------------------------------------------------- writing helpers


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Write to a temporary name and rename, so a crash never leaves a half file under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    write(tmp)
    os.replace(tmp, path)


def _write_parquet(table: pa.Table, path: Path) -> None:
    _write_atomic(path, lambda tmp: pq.write_table(table, tmp))


def _write_json(obj: Any, path: Path) -> None:
    _write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=4) + "\n"))


def _png(img: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("png", "w")
    ctx.height, ctx.width = img.shape[:2]
    ctx.pix_fmt = "rgb24"
    packets = ctx.encode(av.VideoFrame.from_ndarray(img, format="rgb24")) + ctx.encode(None)
    return b"".join(bytes(p) for p in packets)


def _file_slot(n: int, chunks_size: int) -> tuple[int, int]:
    """(chunk_index, file_index) of the n-th file: file_index rolls into the next chunk at chunks_size."""
    return divmod(n, chunks_size)


def _groups(num_episodes: int, per_file: int) -> list[list[int]]:
    return [list(range(s, min(s + per_file, num_episodes))) for s in range(0, num_episodes, per_file)]


def _sample_indices(length: int) -> set[int]:
    return set(np.linspace(0, length - 1, min(length, STATS_SAMPLE_FRAMES)).round().astype(int).tolist())


def _features(
    cameras: Sequence[str],
    image_keys: Sequence[str],
    height: int,
    width: int,
    fps: float,
    codec: str,
    depth_cameras: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    features: dict[str, dict[str, Any]] = {
        key: {"dtype": "float32", "shape": [len(JOINT_NAMES)], "names": list(JOINT_NAMES)} for key in VECTOR_KEYS
    }
    hwc = {"shape": [height, width, 3], "names": ["height", "width", "channels"]}
    for key in image_keys:
        features[key] = {"dtype": "image", **hwc}
    for key in cameras:
        info = {
            "video.height": height,
            "video.width": width,
            "video.codec": codec,
            "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False,
            "video.fps": fps,
            "video.channels": 3,
            "has_audio": False,
        }
        features[key] = {"dtype": "video", **hwc, "info": info}
    for key in depth_cameras:  # as LeRobot 0.6.1's writer records a depth camera (get_video_info)
        info = {
            "video.height": height,
            "video.width": width,
            "video.codec": "hevc",
            "video.pix_fmt": "gray12le",
            "video.fps": fps,
            "video.channels": 1,
            "has_audio": False,
            "video.g": 2,
            "video.crf": 30,
            "video.depth_min": SYNTH_DEPTH.depth_min,
            "video.depth_max": SYNTH_DEPTH.depth_max,
            "video.shift": SYNTH_DEPTH.shift,
            "video.use_log": SYNTH_DEPTH.use_log,
            "is_depth_map": True,
            "depth_unit": SYNTH_DEPTH.unit,
        }
        shape = {"shape": [height, width, 1], "names": ["height", "width", "channels"]}
        features[key] = {"dtype": "video", **shape, "info": info}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in _DEFAULT_FEATURES[1:]:
        features[key] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _hf_metadata(features: dict[str, dict[str, Any]], vector_storage: str, fingerprint: str) -> dict[bytes, bytes]:
    """The ``huggingface`` schema metadata LeRobot's parquet files carry (datasets' feature spec)."""
    hf: dict[str, Any] = {}
    for key, ft in features.items():
        if ft["dtype"] == "video":
            continue
        if ft["dtype"] == "image":
            hf[key] = {"_type": "Image"}
        elif ft["dtype"] == LANGUAGE_DTYPE:  # lerobot.datasets.language's column feature
            row: dict[str, Any] = {
                f: {"dtype": "float32" if f == "timestamp" else "string", "_type": "Value"} for f in ROW_FIELDS[key]
            }
            row["tool_calls"] = {"feature": {"_type": "Json"}, "_type": "List"}
            hf[key] = {"feature": row, "_type": "List"}
        elif key in VECTOR_KEYS:
            spec = {"feature": {"dtype": "float32", "_type": "Value"}, "_type": "List"}
            if vector_storage == "fixed_size_list":
                spec = {"feature": spec["feature"], "length": ft["shape"][0], "_type": "List"}
            hf[key] = spec
        else:
            hf[key] = {"dtype": ft["dtype"], "_type": "Value"}
    return {b"huggingface": json.dumps({"info": {"features": hf}, "fingerprint": fingerprint}).encode()}


def _tasks_table(tasks: Sequence[str]) -> pa.Table:
    """meta/tasks.parquet as pandas writes a DataFrame indexed by task string (LeRobot 0.4.x)."""
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.3.3",
    }
    schema = pa.schema(
        [("task_index", pa.int64()), ("__index_level_0__", pa.string())],
        metadata={b"pandas": json.dumps(pandas_meta).encode()},
    )
    return pa.table({"task_index": list(range(len(tasks))), "__index_level_0__": list(tasks)}, schema=schema)


# ---------------------------------------------------------------- the dataset

Stats = dict[str, np.ndarray]


def synth_dataset(
    root: str | os.PathLike[str],
    *,
    num_episodes: int = 4,
    cameras: Sequence[str] = ("observation.images.front", "observation.images.top"),
    height: int = 64,
    width: int = 160,
    fps: int | float = 30,
    codec: str = "h264",
    gop: int = 2,
    crf: int = 30,
    episodes_per_video_file: int = 2,
    episodes_per_data_file: int = 2,
    chunks_size: int = 1000,
    length_range: tuple[int, int] = (20, 40),
    num_tasks: int = 2,
    vector_storage: str = "fixed_size_list",
    image_keys: Sequence[str] = (),
    from_timestamp_jitter_s: float = 0.0,
    texture: str = "flat",
    to_timestamp_short_frames: int = 0,
    timestamp_jitter_s: float = 0.0,
    codec_label: str | None = None,
    bframes: int = 0,
    seed: int = 0,
    workers: int = 1,
    language: bool = False,
    depth_cameras: Sequence[str] = (),
    frame_bits: int = 10,
) -> Path:
    """Write a LeRobot v3.0 dataset under ``root`` (which must be absent or empty) and return its path.

    Episodes are encoded one by one and joined by stream copy, so each starts on a keyframe at
    the ``from_timestamp`` the metadata records, as in LeRobot. Lengths are drawn from the
    inclusive ``length_range`` with ``seed``; episode e has task ``f"task {e % num_tasks}"``.
    ``from_timestamp_jitter_s`` moves every episode but a file's first by a deterministic
    amount in [-jitter, +jitter] per camera, like real files that are off by a fraction of a
    frame (so readers must take the nearest frame). ``texture="realistic"`` gives frames the
    weight of real footage (see ``paint_identity``; ~21 KB per 640x480 AV1 frame), for benchmarks
    where bandwidth and seeks must show. Same arguments give byte-identical files;
    ``meta/info.json`` is written last and marks a complete dataset.

    Quirks of real recordings that LeRobot tolerates, to test readers against:
    ``to_timestamp_short_frames`` records every episode's ``to_timestamp`` that many frames short
    of its rows (the mp4 still holds every frame); ``timestamp_jitter_s`` moves each row's
    ``timestamp`` by a deterministic amount in [-jitter, +jitter] (within LeRobot's tolerance_s,
    1e-4 s, when below it); ``codec_label`` is written to info.json as every camera's
    ``video.codec`` whatever the stream holds; ``bframes`` encodes H.264 with that many B-frames
    (keyframes still every ``gop`` frames). One episode per file is ``episodes_per_*_file=1``.
    ``language`` adds LeRobot 0.6.1's annotation columns (``language_rows`` says what each frame holds).

    ``workers`` > 1 paints and encodes each camera's episodes in that many spawned processes
    (a realistic 480p episode costs seconds of a core); the files are byte-identical to
    ``workers=1``'s, as every clip is a pure function of its arguments and is joined in order. As
    with any spawned pool, a script that calls it must do so under ``if __name__ == "__main__"``.

    ``depth_cameras`` are depth-map cameras as LeRobot 0.6.1 records them: 12-bit codes
    (``paint_depth``, read back by ``read_depth_identity``) in lossless gray12le HEVC whatever
    ``codec`` says, feature ``info`` with ``is_depth_map`` and LeRobot's default quantizer
    (``SYNTH_DEPTH``), stats in millimetres.
    ``frame_bits`` of the 20 painted identity bands hold the frame index, the rest the episode
    index: 12 paints episodes of up to 4,096 frames (long-episode benchmarks), 256 episodes at
    most; read them back with ``read_identity(frame_bits=12, episode_bits=8)``.
    """
    root = Path(root)
    cameras, image_keys, depth_cameras = tuple(cameras), tuple(image_keys), tuple(depth_cameras)
    lo, hi = length_range
    checks = [
        (1 <= frame_bits <= IDENTITY_BITS - 1, f"frame_bits {frame_bits} must be in [1, {IDENTITY_BITS - 1}]"),
        (
            1 <= num_episodes <= 2 ** (IDENTITY_BITS - frame_bits),
            f"num_episodes {num_episodes} must be in [1, {2 ** (IDENTITY_BITS - frame_bits)}] (identity bits)",
        ),
        (
            1 <= lo <= hi <= 2**frame_bits,
            f"length_range {length_range} must satisfy 1 <= min <= max <= {2**frame_bits} (frame_bits={frame_bits})",
        ),
        (codec in CODECS, f"codec {codec!r} is not one of {sorted(CODECS)}"),
        (texture in TEXTURES, f"texture {texture!r} is not one of {TEXTURES}"),
        (
            vector_storage in ("fixed_size_list", "list"),
            f"vector_storage {vector_storage!r}: use fixed_size_list or list",
        ),
        (
            min(episodes_per_video_file, episodes_per_data_file, chunks_size, num_tasks) >= 1,
            "episodes_per_video_file, episodes_per_data_file, chunks_size and num_tasks must be >= 1",
        ),
        (
            len(set(cameras + image_keys + depth_cameras)) == len(cameras + image_keys + depth_cameras),
            f"duplicate keys in {cameras + image_keys + depth_cameras}",
        ),
        (
            not depth_cameras or min(height, width) >= HEVC_MIN_SIDE,
            f"depth cameras (HEVC) need frames of at least {HEVC_MIN_SIDE}x{HEVC_MIN_SIDE}, got {width}x{height}",
        ),
        (
            0 <= from_timestamp_jitter_s < 0.5 / fps,
            f"from_timestamp_jitter_s {from_timestamp_jitter_s} must be in [0, half a frame = {0.5 / fps})",
        ),
        (
            0 <= timestamp_jitter_s < 0.5 / fps,
            f"timestamp_jitter_s {timestamp_jitter_s} must be in [0, half a frame = {0.5 / fps})",
        ),
        (0 <= to_timestamp_short_frames < lo, f"to_timestamp_short_frames must be in [0, {lo})"),
        (bframes == 0 or (codec == "h264" and gop > bframes), "bframes need codec h264 and gop > bframes"),
        (  # checked again by the encoder; here before anything is written
            codec != "hevc" or min(height, width) >= HEVC_MIN_SIDE,
            f"codec hevc needs frames of at least {HEVC_MIN_SIDE}x{HEVC_MIN_SIDE}, got {width}x{height} (width x height)",
        ),
        (workers >= 1, f"workers {workers} must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"synth_dataset: {message}")
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"synth_dataset: {root} is not empty")

    lengths = [int(n) for n in np.random.default_rng(seed).integers(lo, hi + 1, size=num_episodes)]
    tasks = [f"task {k}" for k in range(min(num_tasks, num_episodes))]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    features = _features(cameras, image_keys, height, width, fps, codec_label or codec, depth_cameras)
    if language:
        features.update({k: {"dtype": LANGUAGE_DTYPE, "shape": [1], "names": None} for k in LANGUAGE_COLUMNS})
    episodes: list[dict[str, Any]] = [
        {
            "episode_index": e,
            "tasks": [tasks[e % len(tasks)]],
            "length": n,
            "dataset_from_index": starts[e],
            "dataset_to_index": starts[e + 1],
        }
        for e, n in enumerate(lengths)
    ]
    stats: list[dict[str, Stats]] = [{} for _ in episodes]
    signature = repr(
        (length_range, num_tasks, episodes_per_data_file, chunks_size, vector_storage, image_keys, height, width, seed)
    )
    for n, group in enumerate(_groups(num_episodes, episodes_per_data_file)):
        chunk, file = _file_slot(n, chunks_size)
        metadata = _hf_metadata(features, vector_storage, _fingerprint(signature, n))
        table = _data_table(
            [episodes[e] for e in group],
            tasks,
            features,
            vector_storage,
            metadata,
            fps,
            stats,
            texture,
            seed,
            timestamp_jitter_s,
            frame_bits,
        )
        _write_parquet(table, root / DATA_PATH.format(chunk_index=chunk, file_index=file))
        for e in group:
            episodes[e]["data/chunk_index"], episodes[e]["data/file_index"] = chunk, file

    jitter_rng = np.random.default_rng([seed, 1])  # its own stream: jitter leaves lengths alone
    all_cameras = cameras + depth_cameras
    files = [
        (c, n, group)
        for c in range(len(all_cameras))
        for n, group in enumerate(_groups(num_episodes, episodes_per_video_file))
    ]
    clips = [
        _Clip(
            e, lengths[e], c, height, width, texture, seed, fps, codec, gop, crf, bframes, c >= len(cameras), frame_bits
        )
        for c, _, group in files
        for e in group
    ]
    with contextlib.closing(_in_order(_encode_clip, clips, workers)) as encoded:
        for c, n, group in files:
            camera = all_cameras[c]
            chunk, file = _file_slot(n, chunks_size)
            mp4s = []
            for e in group:
                mp4, stats[e][camera] = next(encoded)
                mp4s.append(mp4)
            offsets: list[float] = []
            path = root / VIDEO_PATH.format(video_key=camera, chunk_index=chunk, file_index=file)
            _write_atomic(
                path,
                lambda tmp: offsets.extend(concat_clips(mp4s, tmp, reordered=bframes > 0)),  # noqa: B023 (called at once)
            )
            for e, offset in zip(group, offsets):
                if offset > 0 and from_timestamp_jitter_s:
                    offset += float(jitter_rng.uniform(-from_timestamp_jitter_s, from_timestamp_jitter_s))
                episodes[e].update(
                    {
                        f"videos/{camera}/chunk_index": chunk,
                        f"videos/{camera}/file_index": file,
                        f"videos/{camera}/from_timestamp": offset,
                        f"videos/{camera}/to_timestamp": offset + (lengths[e] - to_timestamp_short_frames) / fps,
                    }
                )

    _write_parquet(_episodes_table(episodes, stats, features, all_cameras), root / EPISODES_PATH)
    _write_parquet(_tasks_table(tasks), root / "meta/tasks.parquet")
    dataset_stats = {key: _aggregate([st[key] for st in stats]) for key in features if key not in LANGUAGE_COLUMNS}
    _write_json(
        {key: {s: v.tolist() for s, v in st.items()} for key, st in dataset_stats.items()}, root / "meta/stats.json"
    )
    info = {
        "codebase_version": "v3.0",
        "robot_type": "synthetic",
        "total_episodes": num_episodes,
        "total_frames": starts[-1],
        "total_tasks": len(tasks),
        "chunks_size": chunks_size,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": fps,
        "splits": {"train": f"0:{num_episodes}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if all_cameras else None,
        "features": features,
    }
    _write_json(info, root / "meta/info.json")
    return root


def _data_table(
    episodes: list[dict[str, Any]],
    tasks: list[str],
    features: dict[str, dict[str, Any]],
    vector_storage: str,
    metadata: dict[bytes, bytes],
    fps: float,
    stats: list[dict[str, Stats]],
    texture: str,
    seed: int,
    timestamp_jitter_s: float = 0.0,
    frame_bits: int = 10,
) -> pa.Table:
    """One data parquet's rows: every column encodes its (episode, frame); fills the episodes' stats."""
    size = len(JOINT_NAMES) if vector_storage == "fixed_size_list" else -1
    types = {
        "float32": pa.float32(),
        "int64": pa.int64(),
        "vector": pa.list_(pa.field("element", pa.float32()), size),
        "image": pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
        **{k: _language_type(k) for k in LANGUAGE_COLUMNS},
    }
    keys = [k for k, ft in features.items() if ft["dtype"] != "video"]
    schema = pa.schema(
        [
            (k, types[k if k in LANGUAGE_COLUMNS else "vector" if k in VECTOR_KEYS else features[k]["dtype"]])
            for k in keys
        ],
        metadata=metadata,
    )
    num_cameras = sum(ft["dtype"] == "video" for ft in features.values())
    image_keys = [k for k in keys if features[k]["dtype"] == "image"]
    columns: dict[str, list[Any]] = {k: [] for k in keys}
    for ep in episodes:
        e, f = ep["episode_index"], np.arange(ep["length"])
        state = identity_vector(e, f)
        values = {
            "action": state + np.float32(0.5),
            "observation.state": state,
            "timestamp": (
                f / fps + np.random.default_rng([seed, 2, e]).uniform(-timestamp_jitter_s, timestamp_jitter_s, len(f))
            ).astype(np.float32),
            "frame_index": f,
            "episode_index": np.full_like(f, e),
            "index": f + ep["dataset_from_index"],
            "task_index": np.full_like(f, tasks.index(ep["tasks"][0])),
        }
        for key, v in values.items():
            columns[key] += v.tolist()
            stats[e][key] = _episode_stats(v)
        for c, key in enumerate(image_keys, start=num_cameras):  # camera_index after the video cameras
            height, width = features[key]["shape"][:2]
            sample: list[np.ndarray] = []
            for i, img in enumerate(_painted(e, len(f), height, width, c, sample, texture, seed, frame_bits)):
                columns[key].append({"bytes": _png(img), "path": f"frame-{i:06d}.png"})
            stats[e][key] = _episode_stats(np.stack(sample), image=True)
        for i in f if LANGUAGE_PERSISTENT in columns else ():
            written = language_rows(e, int(i), ep["length"], fps)
            for key in LANGUAGE_COLUMNS:
                columns[key].append(_stored_language(written[key]))
    return pa.table({k: pa.array(v, type=schema.field(k).type) for k, v in columns.items()}, schema=schema)


def _episodes_table(
    episodes: list[dict[str, Any]],
    stats: list[dict[str, Stats]],
    features: dict[str, dict[str, Any]],
    cameras: Sequence[str],
) -> pa.Table:
    """meta/episodes parquet: one row per episode, columns in LeRobot's order and types."""
    fields = [
        pa.field("episode_index", pa.int64()),
        pa.field("tasks", pa.list_(pa.field("element", pa.string()))),
        pa.field("length", pa.int64()),
        pa.field("data/chunk_index", pa.int64()),
        pa.field("data/file_index", pa.int64()),
        pa.field("dataset_from_index", pa.int64()),
        pa.field("dataset_to_index", pa.int64()),
    ]
    for camera in cameras:
        fields += [pa.field(f"videos/{camera}/{k}", pa.int64()) for k in ("chunk_index", "file_index")]
        fields += [pa.field(f"videos/{camera}/{k}", pa.float64()) for k in ("from_timestamp", "to_timestamp")]
    stat_names = ("min", "max", "mean", "std", "count", *QUANTILES)
    for key, ft in features.items():  # features order, as LeRobot writes the stats columns (none for language)
        if ft["dtype"] == LANGUAGE_DTYPE:
            continue
        fields += [pa.field(f"stats/{key}/{s}", _stats_type(s, ft["dtype"])) for s in stat_names]
    fields += [pa.field("meta/episodes/chunk_index", pa.int64()), pa.field("meta/episodes/file_index", pa.int64())]
    rows = []
    for ep, st in zip(episodes, stats):
        row = dict(ep, **{"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        row.update({f"stats/{key}/{s}": st[key][s].tolist() for key in st if key in features for s in stat_names})
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))


def _painted(
    episode: int,
    length: int,
    height: int,
    width: int,
    camera: int,
    sample: list[np.ndarray],
    texture: str,
    seed: int,
    frame_bits: int = 10,
) -> Iterator[np.ndarray]:
    """Frames of one camera's episode; keeps the stats sample so each frame is painted once."""
    keep = _sample_indices(length)
    bits = {"frame_bits": frame_bits, "episode_bits": IDENTITY_BITS - frame_bits}
    for i in range(length):
        img = paint_identity(episode, i, height, width, camera, texture=texture, seed=seed, **bits)
        if i in keep:
            sample.append(img)
        yield img


T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class _Clip:
    """One camera's episode to paint and encode: the unit of work of ``synth_dataset(workers=N)``."""

    episode: int
    length: int
    camera: int
    height: int
    width: int
    texture: str
    seed: int
    fps: float
    codec: str
    gop: int
    crf: int
    bframes: int
    depth: bool = False  # a depth camera: paint_depth codes, lossless gray12le HEVC
    frame_bits: int = 10


def _encode_clip(clip: _Clip) -> tuple[bytes, Stats]:
    """The clip's mp4 bytes and image stats: a pure function of ``clip`` (encoders run with
    ``threads=1``, whose output never depends on scheduling), so no process can change a byte."""
    if clip.depth:
        return _encode_depth_clip(clip)
    sample: list[np.ndarray] = []
    buf = io.BytesIO()
    frames = _painted(
        clip.episode,
        clip.length,
        clip.height,
        clip.width,
        clip.camera,
        sample,
        clip.texture,
        clip.seed,
        clip.frame_bits,
    )
    encode_video(
        frames, buf, fps=clip.fps, codec=clip.codec, gop=clip.gop, crf=clip.crf, threads=1, bframes=clip.bframes
    )
    return buf.getvalue(), _episode_stats(np.stack(sample), image=True)


def _encode_depth_clip(clip: _Clip) -> tuple[bytes, Stats]:
    """A depth camera's clip and its stats (millimetres, as dequantized: one channel)."""
    import torch

    from .depth import dequantize

    codes = [paint_depth(clip.episode, i, clip.height, clip.width) for i in range(clip.length)]
    buf = io.BytesIO()
    encode_depth_video(codes, buf, fps=clip.fps, gop=clip.gop)
    kept = sorted(_sample_indices(clip.length))
    mm = dequantize(torch.from_numpy(np.stack([codes[i] for i in kept]).astype(np.int32))[:, None], SYNTH_DEPTH, "mm")
    return buf.getvalue(), _episode_stats(mm.numpy().transpose(0, 2, 3, 1), depth=True)


def _in_order(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Generator[R, None, None]:
    """``map(fn, items)``, computed by ``workers`` spawned processes when above 1, yielded in order.

    Spawned, not forked: PyAV's and Arrow's thread pools do not survive a fork. Leaving early (an
    error in the caller) cancels the clips not started yet instead of encoding them for nothing.
    """
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    pool = ProcessPoolExecutor(min(workers, len(items)), mp_context=mp.get_context("spawn"))
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _fingerprint(signature: str, file_number: int) -> str:
    return hashlib.sha256(f"{signature}/{file_number}".encode()).hexdigest()[:16]
