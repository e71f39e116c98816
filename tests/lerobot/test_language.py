"""Language annotation columns on a dataset LeRobot 0.6.1 wrote and annotated itself (``LeRobotDataset``'s
writer, then ``lerobot-annotate``'s staging, ``LanguageColumnsWriter`` and ``info.json`` update): every
sample's ``language_persistent`` / ``language_events`` equal ``LeRobotDataset[i]``'s in value and type,
and batches equal ``lerobot_collate_fn``'s, raw and converted, with and without workers; ``lerobot-shards
train`` trains from it with 2 workers (their batches in slabs, as ``lerobot_collate_fn`` makes them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.language import LANGUAGE_COLUMNS, LANGUAGE_EVENTS, LANGUAGE_PERSISTENT
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.transport import SlabCollate, with_slabs

CAM = "observation.images.front"
FPS = 10


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from lerobot.annotations.steerable_pipeline.executor import Executor
    from lerobot.annotations.steerable_pipeline.reader import iter_episodes
    from lerobot.annotations.steerable_pipeline.staging import EpisodeStaging
    from lerobot.annotations.steerable_pipeline.writer import LanguageColumnsWriter, speech_atom
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    base = tmp_path_factory.mktemp("annotated")
    raw = base / "raw"
    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
        CAM: {"dtype": "video", "shape": (32, 48, 3), "names": ["height", "width", "channels"]},
    }
    ds = LeRobotDataset.create("local/annotated", fps=FPS, features=features, root=raw, use_videos=True)
    for ep in range(3):
        for i in range(10 + ep):
            ds.add_frame(
                {
                    "observation.state": np.array([ep, i], np.float32),
                    "action": np.array([i, ep], np.float32),
                    CAM: np.full((32, 48, 3), 20 * i, np.uint8),
                    "task": f"task {ep}",
                }
            )
        ds.save_episode()
    ds.finalize()
    staging = base / "staging"
    for record in iter_episodes(raw, only_episodes=(0, 1)):  # episode 2 stays unannotated
        ep, ts = record.episode_index, record.frame_timestamps
        rows = EpisodeStaging(staging, ep)
        rows.write(
            "plan",
            [
                {"role": "assistant", "content": f"plan {ep}: reach, grasp", "style": "plan", "timestamp": 0.0},
                {"role": "assistant", "content": f"reach {ep}", "style": "subtask", "timestamp": 0.0},
                {"role": "assistant", "content": f"grasp {ep}", "style": "subtask", "timestamp": 0.3},  # float32 off
                {"role": "user", "content": "déplace le cube ✓", "style": "task_aug", "timestamp": 0.0},
            ],
        )
        say = speech_atom(ts[3], f"ok {ep}")
        say["tool_calls"][0]["function"]["arguments"]["pace"] = 0.123456789012345  # ujson keeps 10 decimals
        rows.write(
            "interjections",
            [{"role": "user", "content": f"stop {ep}", "style": "interjection", "timestamp": ts[3]}, say],
        )
        rows.write("vqa", [{"role": "user", "content": "where?", "style": "vqa", "timestamp": ts[7], "camera": CAM}])
    LanguageColumnsWriter().write_all(list(iter_episodes(raw)), staging, raw)
    Executor._ensure_annotation_metadata_in_info(raw)
    shards = base / "shards"
    convert_dataset(raw, shards, progress=False)
    return {"raw": raw, "shards": shards}


def _theirs(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/annotated", root=root, return_uint8=True)


def _same(got: object, want: object, where: str) -> None:
    assert type(got) is type(want), where
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.mark.parametrize("source", ["raw", "shards"])
def test_samples_are_lerobots(annotated: dict[str, Path], source: str) -> None:
    theirs = _theirs(annotated["raw"])
    assert theirs.meta.has_language_columns
    ours = EpisodePoolDataset(str(annotated[source]), image_dtype=torch.uint8)
    assert (
        ours.meta.has_language_columns and ours.meta.features[LANGUAGE_EVENTS] == theirs.meta.features[LANGUAGE_EVENTS]
    )
    seen, events = 0, 0
    for sample in ours:
        want = theirs[int(sample["index"])]
        assert sorted(sample) == sorted(want)
        for key, value in want.items():
            _same(sample[key], value, f"{source} {int(sample['index'])} {key}")
        seen += 1
        events += len(sample[LANGUAGE_EVENTS])
    assert seen == theirs.num_frames and events == 2 * 3  # two annotated episodes: 2 events at ts[3], 1 at ts[7]


@pytest.mark.parametrize("source", ["raw", "shards"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_lerobot_collate_fns(annotated: dict[str, Path], num_workers: int, source: str) -> None:
    from lerobot.utils.collate import lerobot_collate_fn

    from lerobot_shards.integrations.lerobot_train import _collate_drops

    theirs = _theirs(annotated["raw"])
    ds = EpisodePoolDataset(str(annotated[source]), image_dtype=torch.uint8, seed=1)
    # as LeRobot's trainer builds it (collate_fn chosen by meta.has_language_columns), then as we rebuild it
    loader = DataLoader(ds, batch_size=4, num_workers=num_workers, collate_fn=lerobot_collate_fn)
    rebuilt = with_slabs(loader, drop=_collate_drops(loader))
    assert _collate_drops(loader) == LANGUAGE_COLUMNS and isinstance(rebuilt.collate_fn, SlabCollate)
    assert rebuilt.num_workers == num_workers  # without workers too: the main process's own slabs
    frames = 0
    for batch in rebuilt:
        want = lerobot_collate_fn([theirs[int(i)] for i in batch["index"]])
        assert not {LANGUAGE_PERSISTENT, LANGUAGE_EVENTS} & set(batch)
        assert sorted(batch) == sorted(want)
        for key, value in want.items():
            _same(batch[key], value, f"batch {key}")
        frames += len(batch["index"])
    assert frames == theirs.num_frames


def test_lerobot_shards_train_trains_from_annotated_shards(annotated: dict[str, Path], tmp_path: Path) -> None:
    from procs import CLI, env, run
    from test_train import ACT, TIMEOUT, _args

    args = [*_args(str(annotated["shards"]), tmp_path / "run", ACT, steps=4, save_freq=4), "--num_workers=2"]
    log = run([*CLI, "train", *args], tmp_path / "log.txt", env(), TIMEOUT)
    assert "2 workers hand batches over in reused shared-memory slabs (SlabCollate)" in log
    assert (tmp_path / "run/checkpoints/000004/pretrained_model/model.safetensors").is_file()
