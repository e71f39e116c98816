"""The loader's options in three groups, each option defined, validated and documented once, here.

``OrderOptions`` fix the emission order (a resume state records them, ``checkpoint.py``),
``ReadOptions`` say what to read and how (storage, cache, read-ahead, bad bytes, a raw source's
virtual shards), ``DecodeOptions`` how frames are decoded (device, backend, threads, dtype,
resize). Each is frozen and checks every field in ``__post_init__``: a bad value raises one line
naming the option when the group (or the dataset) is built, before any I/O. Choices are
``Literal`` types, and the error lists them.

``EpisodePoolDataset`` takes the groups (``order=``, ``read=``, ``decode=``) or the same options as
flat keywords named like the fields (``seed=3``, ``cache_dir=...``): ``group_options`` routes a
keyword to the group that defines it, so a new option is one field (with its check and its
comment) in one class here. ``None`` defaults that depend on the dataset (pool size, cameras,
world size, the cache's disk) are resolved by the dataset into a copy of the group.
"""

from __future__ import annotations

import collections
import dataclasses
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from ..depth import check_unit
from ..format import RESIZE_MODES
from ..resize import check_mode, check_size
from ..storage import StorageLocation, as_location
from .transport.device import rank_device

OnError = Literal["raise", "skip"]
Partition = Literal["global", "node"]
CudaBackend = Literal["nvdec", "ffmpeg"]  # torchcodec's names
ResizeMode = Literal["pad", "crop", "stretch"]  # format.RESIZE_MODES, as convert --resize stores them
FramePixels = Literal["yuv420p", "rgb"]  # frame_cache.Pixels
Size = tuple[int, int]
assert get_args(ResizeMode) == RESIZE_MODES
IMAGE_DTYPES = (torch.float32, torch.uint8)


def _int(name: str, value: Any, low: int, *, none: str = "", none_first: bool = False, hint: str = "") -> None:
    """``value`` must be an int >= ``low``, or None when ``none`` says what None means."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        if none and none_first:
            allowed = f"None ({none}) or an int >= {low}"
        else:
            allowed = f"an int >= {low}" + (f" (None: {none})" if none else "")
        raise ValueError(f"{name} must be {allowed}{f'; {hint}' if hint else ''}, got {value!r}")


def plain_numbers(obj: Any) -> None:
    """Store a frozen dataclass's numeric fields as Python ints and floats, before they are checked:
    numpy's ``int64`` passes an ``Integral`` check but not ``json.dumps``, which a resume state
    and a mixture's digest go through (it failed at the first checkpoint, naming no field)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool) or type(value) in (int, float):
            continue
        if isinstance(value, numbers.Integral):
            object.__setattr__(obj, f.name, int(value))
        elif isinstance(value, numbers.Real):
            object.__setattr__(obj, f.name, float(value))


def _bool(name: str, value: Any, *, none: str = "") -> None:
    if not (isinstance(value, bool) or (value is None and none)):
        raise ValueError(f"{name} must be True or False{f' or None ({none})' if none else ''}, got {value!r}")


def _choice(name: str, value: Any, kind: Any) -> None:
    choices = get_args(kind)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass(frozen=True)
class OrderOptions:
    """The emission order; with the episode subset and the shard plan, what a resume state records."""

    # Episodes resident per consumer; frames are drawn uniformly across them.
    episode_pool_size: int = 16
    # Randomness of shard assignment, shard order and frame order.
    seed: int = 0
    # False: episodes and frames in order (a pool of one).
    shuffle: bool = True
    # Every consumer yields total_frames // consumers samples, so all ranks run the same number
    # of batches and DDP never hangs at epoch end; a consumer above that count drops its last
    # frames, one below repeats frames. None: on when world_size > 1 (like DistributedSampler's
    # padding), off for a single rank, where every frame is then emitted exactly once.
    equal_samples_per_rank: bool | None = None
    # Must match the DataLoader's drop_last (resume counts batches with it).
    drop_last: bool = False
    # Frames at each episode's end never sampled, as LeRobot's EpisodeAwareSampler leaves out a
    # policy's ``drop_n_last_frames`` (Diffusion: 7); windows still read them as context. An
    # episode of at most this many frames gives no sample.
    drop_n_last_frames: int = 0
    # "global": every epoch the shards are dealt to all ranks anew. "node": each node (ranks
    # grouped by LOCAL_WORLD_SIZE, rank // local_world_size) reads the same part of the dataset
    # every epoch, dealt anew to its own ranks and workers, so a node-local frame or shard cache
    # is hit from the second epoch on; a resume keeps the node count (``partition.node_parts``).
    partition: Partition = "global"

    def __post_init__(self) -> None:
        plain_numbers(self)
        _int("episode_pool_size", self.episode_pool_size, 1)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        if self.seed >= 2**64:
            raise ValueError(f"seed must be below 2**64 (a random stream's key), got {self.seed}")
        object.__setattr__(self, "seed", int(self.seed))
        _bool("shuffle", self.shuffle)
        _bool("equal_samples_per_rank", self.equal_samples_per_rank, none="on when world_size > 1")
        _bool("drop_last", self.drop_last)
        _int("drop_n_last_frames", self.drop_n_last_frames, 0, hint="the frames left unsampled at each episode's end")
        _choice("partition", self.partition, Partition)


@dataclass(frozen=True)
class ReadOptions:
    """What to read and how: storage, the node cache, read-ahead, bad bytes, virtual shards."""

    # fsspec options for remote sources (e.g. the s3 endpoint and keys); the loader adds
    # connect/read timeouts and bounded retries for S3 (``remote.with_timeouts``; yours win).
    storage_options: Mapping[str, Any] | None = None
    # The revision (branch, tag or commit) of a source given as a Hub repo id (``lerobot/pusht``);
    # None: the codebase-version tag LeRobot picks (``integrations.hub.repo_url``).
    revision: str | None = None
    # Local directory where remote shards (and a raw dataset's mp4s) are downloaded whole,
    # shared by every worker and rank on the node (``loader.read.shard_cache``).
    cache_dir: str | None = None
    # Bound on the cache's size; None: half the free space of its filesystem, at most 1 TiB
    # (``cache.default_cache_bytes``). Unused files are evicted LRU.
    cache_max_bytes: int | None = None
    # Episodes read ahead in the background; None: the pool size. The reader always reads at
    # least the next episode ahead.
    prefetch_episodes: int | None = None
    # An episode whose bytes do not match their checksum after one re-fetch: "raise", or "skip"
    # it (its samples dropped, logged and counted in stats(); in equal-count mode each dropped
    # sample is replaced by another frame of a good resident episode, samples_substituted).
    on_error: OnError = "raise"
    # A raw source's virtual shard plan, as the converter's (a size or an episode count; None:
    # the converter's default size). Fixes the order: resume states record its digest.
    shard_bytes: int | None = None
    episodes_per_shard: int | None = None
    # Bytes one consumer (the main process, or each DataLoader worker) may hold: its resident and
    # read-ahead episodes (encoded clips, decoded tables, sidecar rows), its decoders, the frames
    # decoded ahead (``plan.budget``). Enforced by admitting fewer episodes: the read-ahead shrinks
    # first, then the pool, never below one episode; the pool size comes from metadata alone (the
    # manifest's shard bytes), so a resume with the same budget sees the same order. None: half the
    # node's memory (its cgroup's limit, else MemTotal) over its ranks (LOCAL_WORLD_SIZE) and one
    # consumer per core of each rank (``dataset.default_memory_budget``).
    memory_budget_bytes: int | None = None
    # Read a converted dataset of format 1 or 2 (no digests of its metadata: an edit that keeps it
    # consistent goes unnoticed). Off: such a manifest is refused, so lowering the version of an
    # edited format 3 one cannot switch the checks off (``format.LEGACY_VERSIONS``).
    legacy_format: bool = False
    # Where a raw dataset's data files (data/ and videos/: parquet, mp4) are when not beside its
    # metadata: a bucket mirror (s3://...), hf://buckets/..., a local folder. A StorageLocation
    # carries its own storage options (storage_options, the metadata's, never go to it); a URL or
    # path is opened with none (credentials from the environment). Made a StorageLocation here, once.
    data_files_root: StorageLocation | str | None = None

    def __post_init__(self) -> None:
        plain_numbers(self)
        root = self.data_files_root
        if root is not None:
            root = os.fspath(root) if isinstance(root, os.PathLike) else root
            if not isinstance(root, (StorageLocation, str)) or root == "":
                raise ValueError(f"data_files_root must be a URL, a path or a StorageLocation, got {root!r}")
            object.__setattr__(self, "data_files_root", as_location(root))
        if not isinstance(self.legacy_format, bool):
            raise ValueError(f"legacy_format must be True or False, got {self.legacy_format!r}")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ValueError(f"storage_options must be a dict or None, got {type(self.storage_options).__name__}")
        if self.revision is not None and (not isinstance(self.revision, str) or not self.revision.strip()):
            raise ValueError(f"revision must be a branch, tag or commit of a Hub repo, or None, got {self.revision!r}")
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or not isinstance(os.fspath(self.cache_dir), str):
                raise ValueError(f"cache_dir must be a path or None, got {self.cache_dir!r}")
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
            if os.path.lexists(self.cache_dir) and not os.path.isdir(self.cache_dir):
                raise ValueError(f"cache_dir {self.cache_dir!r} is not a directory; give a directory for the cache")
        _int("cache_max_bytes", self.cache_max_bytes, 1, none="half the cache disk's free space")
        _int(
            "prefetch_episodes",
            self.prefetch_episodes,
            1,
            none="the pool size",
            hint="the reader always reads at least the next episode ahead",
        )
        _choice("on_error", self.on_error, OnError)
        _int(
            "memory_budget_bytes",
            self.memory_budget_bytes,
            1 << 20,
            none="half the node's memory per consumer",
            hint="the bytes each consumer (process or DataLoader worker) may hold",
        )
        _int("shard_bytes", self.shard_bytes, 1, none="the converter's default")
        _int("episodes_per_shard", self.episodes_per_shard, 1, none="by size")
        if self.shard_bytes is not None and self.episodes_per_shard is not None:
            raise ValueError("give shard_bytes or episodes_per_shard, not both")


@dataclass(frozen=True)
class DecodeOptions:
    """How frames are decoded: device, backend, threads, dtype, size."""

    # "cpu", "cuda" (this rank's GPU: LOCAL_RANK, resolved here, in the parent) or "cuda:N"
    # (NVDEC; DataLoader workers then need multiprocessing_context="spawn").
    video_decode_device: str = "cpu"
    # torchcodec's CUDA backend.
    cuda_decode_backend: CudaBackend = "nvdec"
    # A clip this GPU cannot decode raises instead of falling back to the CPU with one warning
    # (per worker process).
    strict_cuda_decode: bool = False
    # torch.float32 in [0, 1] like LeRobot, or torch.uint8 (DeviceFeeder converts on the GPU).
    image_dtype: torch.dtype = torch.float32
    # Threads decoding video in each consumer (0: in the iterating thread). torchcodec releases
    # the GIL, so threads decode in parallel; the frames of the next ``decode_ahead`` samples
    # are decoded ahead and samples keep their order. None: one per core (up to 8) in the main
    # process, the cores left per worker in DataLoader workers (none with more workers than
    # cores), 0 with NVDEC (``decode.auto_decode_threads``).
    decode_threads: int | None = None
    # Samples whose frames are decoded (and augmented, with ``image_transforms``) ahead of the one
    # the iterating thread takes; None: 2 x decode_threads (at least 1). More lets the decode
    # threads prepare the next batch while a training step runs in the iterating thread (no
    # DataLoader workers: ``lerobot-shards train`` sets a batch), at the memory of those samples.
    decode_ahead: int | None = None
    # FFmpeg threads per clip (0: FFmpeg's choice). 1 is fastest for random access (threaded
    # decoders flush on every seek) and keeps many workers from oversubscribing cores.
    num_ffmpeg_threads: int = 1
    # Decoders kept per consumer; None: pool size x cameras, at most 64.
    decoder_cache_size: int | None = None
    # Decode at (height, width), or {camera: (height, width)} ("*": every other camera), for raw
    # datasets and full-size shards (shards converted with --resize are already that size).
    resize: Sequence[int] | Mapping[str, Sequence[int]] | None = None
    # How a frame of another aspect becomes that size, as convert --resize stores it.
    resize_mode: ResizeMode = "pad"
    # Augmentation of every sample's camera and image values (a window or one frame, as decoded),
    # e.g. LeRobot's ImageTransforms: a picklable callable tensor -> tensor, run under torch's
    # generator seeded per sample from (seed, epoch, episode, frame) (``augment``), so a resumed
    # run or another worker layout transforms each sample as before. None: frames as decoded.
    image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None
    # Local directory of the node's decoded-frame cache (``loader.decoding.frame_cache``), shared by every
    # worker and rank on the node: each episode's frames are decoded once, in order, as it is
    # admitted, and read back from there (this epoch and the next). CPU decoding only. None: off.
    frame_cache_dir: str | None = None
    # Bound on its size; None: half the free space of its filesystem, at most 1 TiB (as cache_dir's).
    frame_cache_bytes: int | None = None
    # How its entries keep frames. "yuv420p": as the decoder gives them (8-bit 4:2:0, half the bytes
    # of RGB: half the cold epoch's writes and the page cache a warm epoch needs), converted at each
    # read exactly as torchcodec converts (~0.12 ms per 480p frame), wherever that can be done bit
    # for bit (AV1, H.264, HEVC, VP9; widths a multiple of 32; no resize; not image_transforms'
    # planar frames), RGB elsewhere. "rgb": RGB always (no conversion at read, twice the bytes).
    frame_cache_pixels: FramePixels = "yuv420p"
    # Depth cameras' frames (and stats) in millimetres ("mm", LeRobot's default depth_output_unit) or
    # metres ("m"): float32 (1, H, W) per frame, dequantized as LeRobot does (``depth``).
    depth_output_unit: str = "mm"

    def __post_init__(self) -> None:
        plain_numbers(self)
        object.__setattr__(
            self, "video_decode_device", rank_device(self.video_decode_device, what="video_decode_device")
        )
        _choice("cuda_decode_backend", self.cuda_decode_backend, CudaBackend)
        _bool("strict_cuda_decode", self.strict_cuda_decode)
        if self.image_dtype not in IMAGE_DTYPES:
            raise ValueError(f"image_dtype must be torch.float32 or torch.uint8, got {self.image_dtype}")
        _int("decode_threads", self.decode_threads, 0, none="automatic", none_first=True, hint="0 = decode inline")
        _int("decode_ahead", self.decode_ahead, 1, none="2 x decode_threads")
        _int("num_ffmpeg_threads", self.num_ffmpeg_threads, 0, hint="0 = FFmpeg's choice")
        _int("decoder_cache_size", self.decoder_cache_size, 1, none="pool size x cameras")
        check_mode(self.resize_mode)
        if self.image_transforms is not None and not callable(self.image_transforms):
            raise ValueError(f"image_transforms must be a callable or None, got {self.image_transforms!r}")
        if self.frame_cache_dir is not None:
            if not isinstance(self.frame_cache_dir, (str, os.PathLike)) or not isinstance(
                os.fspath(self.frame_cache_dir), str
            ):
                raise ValueError(f"frame_cache_dir must be a path or None, got {self.frame_cache_dir!r}")
            object.__setattr__(self, "frame_cache_dir", os.fspath(self.frame_cache_dir))
            if os.path.lexists(self.frame_cache_dir) and not os.path.isdir(self.frame_cache_dir):
                raise ValueError(f"frame_cache_dir {self.frame_cache_dir!r} is not a directory; give a directory")
        _int("frame_cache_bytes", self.frame_cache_bytes, 1, none="half the frame cache disk's free space")
        _choice("frame_cache_pixels", self.frame_cache_pixels, FramePixels)
        check_unit(self.depth_output_unit)
        if self.resize is not None:
            per_camera = dict(self.resize) if isinstance(self.resize, Mapping) else {"*": self.resize}
            sizes: dict[str, Size] = {}
            for cam, size in per_camera.items():
                if isinstance(size, (str, bytes)) or not isinstance(size, Sequence):
                    raise ValueError(f"resize {cam!r}: (height, width) expected, got {size!r}")
                check_size(tuple(size), cam)
                sizes[str(cam)] = (int(size[0]), int(size[1]))
            object.__setattr__(self, "resize", sizes)

    @property
    def resize_per_camera(self) -> dict[str, Size]:
        """``resize`` as ``{camera or "*": (height, width)}`` ({} when frames keep their size)."""
        return dict(self.resize or {})  # type: ignore[arg-type]


GROUPS: dict[str, type[OrderOptions] | type[ReadOptions] | type[DecodeOptions]] = {
    "order": OrderOptions,
    "read": ReadOptions,
    "decode": DecodeOptions,
}
_OWNER = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


def check_episodes(name: str, episodes: Any) -> tuple[int, ...] | None:
    """An episode subset as given (``None``: all), checked: indices are ints >= 0 (4.9 or True
    would silently read another episode), each listed once, at least one. Whether each exists is
    checked against the dataset when it opens."""
    if episodes is None:
        return None
    if isinstance(episodes, str | bytes | Mapping) or not isinstance(episodes, Iterable):
        raise ValueError(f"{name} must be a list of episode indices, got {episodes!r}")
    chosen = tuple(episodes)
    for e in chosen:
        if isinstance(e, bool) or not isinstance(e, numbers.Integral) or e < 0:
            raise ValueError(f"{name} must be ints >= 0 (episode indices), got {e!r}")
    twice = sorted(e for e, n in collections.Counter(int(e) for e in chosen).items() if n > 1)
    if twice:
        raise ValueError(f"{name}: episodes {twice} are listed more than once")
    if not chosen:
        raise ValueError(f"{name} is empty: it selects no episode (None reads them all)")
    return tuple(int(e) for e in chosen)


def group_options(
    order: OrderOptions | None,
    read: ReadOptions | None,
    decode: DecodeOptions | None,
    flat: Mapping[str, Any],
    *,
    caller: str = "EpisodePoolDataset()",
) -> tuple[OrderOptions, ReadOptions, DecodeOptions]:
    """The three groups from what was given: a group, or its options as flat keywords, not both."""
    given: dict[str, Any] = {"order": order, "read": read, "decode": decode}
    per_group: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for name, value in flat.items():
        group = _OWNER.get(name)
        if group is None:
            raise TypeError(f"{caller} got an unexpected keyword argument {name!r}")
        if given[group] is not None:
            raise ValueError(f"{name} given as a keyword and {group}= given too: set it in {group}= (or drop {group}=)")
        per_group[group][name] = value
    out = []
    for group, cls in GROUPS.items():
        value = given[group]
        if value is not None and not isinstance(value, cls):
            raise ValueError(f"{group} must be a {cls.__name__}, got {type(value).__name__}")
        out.append(value if value is not None else cls(**per_group[group]))
    return out[0], out[1], out[2]  # type: ignore[return-value]
