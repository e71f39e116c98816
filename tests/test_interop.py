"""The shards read by other tools: Hugging Face ``datasets`` (its ``webdataset`` builder).

Plain ``webdataset.WebDataset(urls)`` is covered in test_convert.py."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.synth import read_identity

CAMS = ("observation.images.front", "observation.images.top")


def test_hugging_face_datasets_streams_one_example_per_episode(synth_factory, tmp_path: Path) -> None:
    from datasets import load_dataset

    raw = synth_factory(num_episodes=3, cameras=CAMS, length_range=(5, 8), seed=2)
    manifest = convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=2), progress=False)
    files = sorted(str(p) for p in (tmp_path / "out/shards").glob("*.tar"))
    examples = list(load_dataset("webdataset", data_files={"train": files}, split="train", streaming=True))

    assert [e["__key__"] for e in examples] == ["e000000", "e000001", "e000002"]
    lengths = {e: n for s in manifest.shards for e, n in zip(s.episodes, s.episode_lengths)}
    for episode, example in enumerate(examples):
        assert sorted(k for k in example if not k.startswith("__")) == sorted(
            ["json", "parquet", *(f"{c}.mp4" for c in CAMS)]
        )
        assert example["json"]["episode_index"] == episode and example["json"]["length"] == lengths[episode]
        rows = pq.read_table(io.BytesIO(example["parquet"]))
        assert rows.column("frame_index").to_pylist() == list(range(lengths[episode]))
        for cam in CAMS:
            decoder = example[f"{cam}.mp4"]  # datasets hands mp4 members over as torchcodec decoders
            last = lengths[episode] - 1
            frames = decoder.get_frames_at([0, last]).data
            assert [read_identity(f) for f in frames] == [(episode, 0), (episode, last)]
