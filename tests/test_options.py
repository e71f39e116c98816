"""Every option has one home: the shard target rule, defaults and choices shared by library and CLI; the
loader's option groups, each option checked once, at construction."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
import torch

from convert_helpers import run_cli
from lerobot_shards.convert import convert_dataset
from lerobot_shards.convert.plan import ConvertOptions, RunOptions, parse_size
from lerobot_shards.format import RESIZE_MODES
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.options import (
    GROUPS,
    DecodeOptions,
    OrderOptions,
    ReadOptions,
    ResizeMode,
    check_episodes,
    group_options,
)
from lerobot_shards.shard_plan import DEFAULT_SHARD_BYTES, EpisodeSize, plan_shards, shard_target


def test_shard_target_is_a_size_or_an_episode_count() -> None:
    assert shard_target() == (DEFAULT_SHARD_BYTES, None)
    assert shard_target(episodes_per_shard=3) == (None, 3)
    assert shard_target(shard_bytes=10) == (10, None)
    with pytest.raises(ValueError, match="not both"):
        shard_target(10, 3)
    with pytest.raises(ValueError, match="episodes_per_shard must be positive"):
        shard_target(episodes_per_shard=0)


def test_convert_options_resolve_the_shard_target() -> None:
    assert ConvertOptions().shard_bytes == DEFAULT_SHARD_BYTES
    options = ConvertOptions(episodes_per_shard=3)
    assert (options.shard_bytes, options.episodes_per_shard) == (None, 3)
    assert ConvertOptions(shard_bytes=parse_size("1MB")).to_dict()["shard_bytes"] == 2**20
    with pytest.raises(ValueError, match="not both"):
        ConvertOptions(shard_bytes=10, episodes_per_shard=3)
    with pytest.raises(ValueError, match="not both"):
        plan_shards([EpisodeSize(0, 5, 100)], target_bytes=10, episodes_per_shard=3)
    assert [s.episodes for s in plan_shards([EpisodeSize(e, 5, 100) for e in range(4)], episodes_per_shard=2)] == [
        (0, 1),
        (2, 3),
    ]


def test_cli_refuses_both_shard_targets_before_touching_anything(tmp_path: Path) -> None:
    result = run_cli("convert", tmp_path / "src", tmp_path / "out", "--shard-size", "1MB", "--episodes-per-shard", "2")
    assert result.returncode == 2
    assert "not both" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# -- the loader's option groups -----------------------------------------------------------------

BAD_LOADER_OPTIONS = [
    ("order", "episode_pool_size", 0, r"episode_pool_size must be an int >= 1, got 0"),
    ("order", "episode_pool_size", 2.0, r"episode_pool_size must be an int >= 1, got 2.0"),
    ("order", "seed", -1, r"seed must be a non-negative int, got -1"),
    ("order", "seed", 2**64, r"seed must be below 2\*\*64"),
    ("order", "shuffle", "yes", r"shuffle must be True or False, got 'yes'"),
    ("order", "equal_samples_per_rank", 1, r"equal_samples_per_rank must be True or False or None .*, got 1"),
    ("order", "drop_last", None, r"drop_last must be True or False, got None"),
    ("order", "drop_n_last_frames", -7, r"drop_n_last_frames must be an int >= 0; the frames left .*, got -7"),
    ("order", "partition", "rack", r"partition must be one of \(.global., .node.\), got .rack."),
    ("read", "storage_options", "anon=true", r"storage_options must be a dict or None, got str"),
    ("read", "revision", "", r"revision must be a branch, tag or commit of a Hub repo, or None, got ''"),
    ("read", "cache_dir", 5, r"cache_dir must be a path or None, got 5"),
    ("read", "cache_max_bytes", 0, r"cache_max_bytes must be an int >= 1 \(None: .*\), got 0"),
    ("read", "prefetch_episodes", 0, r"prefetch_episodes must be an int >= 1 \(None: the pool size\)"),
    ("read", "on_error", "ignore", r"on_error must be one of \('raise', 'skip'\), got 'ignore'"),
    ("read", "shard_bytes", -5, r"shard_bytes must be an int >= 1"),
    ("read", "episodes_per_shard", True, r"episodes_per_shard must be an int >= 1 .*, got True"),
    ("read", "legacy_format", "yes", r"legacy_format must be True or False, got 'yes'"),
    ("read", "data_files_root", "", r"data_files_root must be a URL, a path or a StorageLocation, got ''"),
    ("read", "data_files_root", 5, r"data_files_root must be a URL, a path or a StorageLocation, got 5"),
    ("read", "memory_budget_bytes", 1000, r"memory_budget_bytes must be an int >= 1048576 \(None: half the node's"),
    ("read", "memory_budget_bytes", 2.0**30, r"memory_budget_bytes must be an int >= 1048576"),
    ("decode", "video_decode_device", "tpu", r"video_decode_device must be 'cpu' or 'cuda'"),
    ("decode", "cuda_decode_backend", "beta2", r"cuda_decode_backend must be one of \('nvdec', 'ffmpeg'\)"),
    ("decode", "strict_cuda_decode", "no", r"strict_cuda_decode must be True or False, got 'no'"),
    ("decode", "image_dtype", torch.float16, r"image_dtype must be torch.float32 or torch.uint8, got torch.float16"),
    ("decode", "decode_threads", -1, r"decode_threads must be None \(automatic\) or an int >= 0"),
    ("decode", "decode_ahead", 0, r"decode_ahead must be an int >= 1 \(None: 2 x decode_threads\)"),
    ("decode", "num_ffmpeg_threads", 1.5, r"num_ffmpeg_threads must be an int >= 0; 0 = FFmpeg's choice, got 1.5"),
    ("decode", "decoder_cache_size", 0, r"decoder_cache_size must be an int >= 1 \(None: pool size x cameras\)"),
    ("decode", "image_transforms", 5, r"image_transforms must be a callable or None, got 5"),
    ("decode", "resize", (63, 64), r"resize size \(63, 64\) \(height, width\) must be two even numbers"),
    ("decode", "resize", (2.5, 4), r"resize size \(2\.5, 4\) \(height, width\) must be two even numbers .*\(ints\)"),
    ("decode", "resize", (True, 2), r"resize size \(True, 2\) \(height, width\) must be two even numbers"),
    (
        "decode",
        "resize",
        (10**6, 10**6),
        r"resize size \(1000000, 1000000\) .* must be two even numbers >= 2 and <= 8192",
    ),
    ("decode", "resize", {"top": 224}, r"resize 'top': \(height, width\) expected, got 224"),
    ("decode", "resize_mode", "squash", r"resize mode 'squash' is not one of pad, crop, stretch"),
    ("decode", "frame_cache_dir", 3, r"frame_cache_dir must be a path or None, got 3"),
    ("decode", "frame_cache_bytes", 0, r"frame_cache_bytes must be an int >= 1 \(None: half the frame cache"),
    (
        "decode",
        "frame_cache_pixels",
        "yuv444p",
        r"frame_cache_pixels must be one of \('yuv420p', 'rgb'\), got 'yuv444p'",
    ),
    ("decode", "depth_output_unit", "cm", r"depth_output_unit must be .mm. or .m., got .cm."),
]


def test_every_loader_option_is_defined_once_and_tested_here() -> None:
    defined = {(g, f.name) for g, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    assert {(g, name) for g, name, _, _ in BAD_LOADER_OPTIONS} == defined
    assert get_args(ResizeMode) == RESIZE_MODES


@pytest.mark.parametrize(("group", "name", "value", "message"), BAD_LOADER_OPTIONS)
def test_every_loader_option_rejects_a_bad_value_in_one_line(group: str, name: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        GROUPS[group](**{name: value})
    assert "\n" not in str(raised.value)
    # The same check for the flat keyword, before the source is even looked at.
    with pytest.raises(ValueError, match=message):
        EpisodePoolDataset("/nonexistent/dataset", **{name: value})


def test_numpy_numbers_are_stored_as_python_ones() -> None:
    """numpy's int64 passes an int check but not json.dumps, which the resume state goes through."""
    order = OrderOptions(episode_pool_size=np.int64(4), seed=np.uint32(7))
    assert (type(order.episode_pool_size), type(order.seed)) == (int, int)
    assert type(DecodeOptions(num_ffmpeg_threads=np.int32(2)).num_ffmpeg_threads) is int
    with pytest.raises(ValueError, match=r"episode_pool_size must be an int >= 1, got 2.5"):
        OrderOptions(episode_pool_size=np.float64(2.5))


def test_option_groups_and_flat_keywords() -> None:
    order, read, decode = group_options(None, None, None, {"seed": 3, "cache_dir": Path("/tmp/c"), "decode_threads": 0})
    assert (order, read.cache_dir, decode.decode_threads) == (OrderOptions(seed=3), "/tmp/c", 0)
    given = OrderOptions(seed=5)
    assert group_options(given, None, None, {})[0] is given
    with pytest.raises(ValueError, match=r"seed given as a keyword and order= given too"):
        group_options(given, None, None, {"seed": 3})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'buffer'"):
        EpisodePoolDataset("/nonexistent/dataset", buffer=3)
    with pytest.raises(ValueError, match=r"decode must be a DecodeOptions, got ReadOptions"):
        EpisodePoolDataset("/nonexistent/dataset", decode=ReadOptions())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"give shard_bytes or episodes_per_shard, not both"):
        ReadOptions(shard_bytes=10, episodes_per_shard=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.seed = 4  # type: ignore[misc]
    assert DecodeOptions(resize=[64, 32]).resize_per_camera == {"*": (64, 32)}


@pytest.mark.parametrize(
    ("episodes", "message"),
    [
        ([1.5], r"episodes must be ints >= 0 \(episode indices\), got 1\.5"),
        ([True], r"episodes must be ints >= 0 \(episode indices\), got True"),
        (["a"], r"episodes must be ints >= 0 \(episode indices\), got 'a'"),
        ([-1], r"episodes must be ints >= 0 \(episode indices\), got -1"),
        ("012", r"episodes must be a list of episode indices, got '012'"),
        ([0, 2, 0, 2], r"episodes: episodes \[0, 2\] are listed more than once"),
        ([], r"episodes is empty: it selects no episode \(None reads them all\)"),
    ],
)
def test_an_episode_subset_is_checked_before_the_source_is_opened(episodes: Any, message: str) -> None:
    """A float or bool index would read another episode than meant, a repeated one would be read
    once: each is refused in one line, before any I/O (the path does not exist)."""
    with pytest.raises(ValueError, match=message):
        EpisodePoolDataset("/nonexistent/dataset", episodes=episodes)


def test_an_episode_subset_accepts_any_int_sequence() -> None:
    import numpy as np

    assert check_episodes("episodes", range(3)) == (0, 1, 2)
    assert check_episodes("episodes", np.array([4, 1])) == (4, 1)
    assert check_episodes("episodes", None) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(workers=0), r"workers must be an int >= 1, got 0"),
        (dict(num_tasks=1.0), r"num_tasks must be an int >= 1, got 1.0"),
        (dict(task_index=-1), r"task_index must be an int >= 0, got -1"),
        (dict(num_tasks=2, task_index=2), r"task_index must be in 0..1, got 2"),
        (dict(finalize_only="yes"), r"finalize_only must be True or False, got 'yes'"),
        (dict(skip_bad_episodes=1), r"skip_bad_episodes must be True or False, got 1"),
        (dict(check_decode=None), r"check_decode must be True or False, got None"),
        (dict(overwrite=0), r"overwrite must be True or False, got 0"),
        (dict(progress="no"), r"progress must be True or False, got 'no'"),
    ],
)
def test_every_run_option_rejects_a_bad_value_in_one_line(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunOptions(**kwargs)
    with pytest.raises(ValueError, match=message):  # the keywords of convert_dataset, before the source is read
        convert_dataset("/nonexistent/source", "/nonexistent/out", **kwargs)


def test_run_options_cover_every_field_and_go_whole_or_as_keywords() -> None:
    tested = {"workers", "num_tasks", "task_index", "finalize_only", "skip_bad_episodes", "check_decode"}
    assert {f.name for f in dataclasses.fields(RunOptions)} == tested | {"overwrite", "progress"}
    with pytest.raises(ValueError, match=r"\['workers'\] given as keywords and run= given too"):
        convert_dataset("/nonexistent/source", "/nonexistent/out", run=RunOptions(), workers=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'worker'"):
        convert_dataset("/nonexistent/source", "/nonexistent/out", worker=2)
