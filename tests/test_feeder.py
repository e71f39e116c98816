"""DeviceFeeder on CPU: the same batches as the float32 loader, normalisation, shutdown, errors, counters."""

from __future__ import annotations

import multiprocessing
import shutil
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.lerobot_v3 import SourceError
from lerobot_shards.loader import DeviceFeeder, EpisodePoolDataset
from lerobot_shards.synth import read_identity, synth_dataset
from waits import HANG_GUARD_S, until, waiting_in

CAM = "observation.images.front"
IMG = "observation.images.wrist"
WINDOW = {CAM: [-1 / 30, 0.0], "action": [0.0, 1 / 30, 2 / 30]}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """4 episodes, one video camera and one image-dtype key, one episode per mp4."""
    return synth_dataset(
        tmp_path_factory.mktemp("feeder") / "ds",
        num_episodes=4,
        cameras=(CAM,),
        image_keys=(IMG,),
        length_range=(8, 14),
        episodes_per_video_file=1,
        seed=5,
    )


def _loader(root: Path, dtype: torch.dtype, num_workers: int = 2, window: dict | None = WINDOW, **kwargs) -> DataLoader:
    ds = EpisodePoolDataset(
        str(root), delta_timestamps=window, episodes_per_shard=1, episode_pool_size=2, seed=3, image_dtype=dtype
    )
    return DataLoader(ds, batch_size=4, num_workers=num_workers, **kwargs)


def _feeder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "DeviceFeeder"]


def test_batches_equal_the_float32_loader(raw: Path) -> None:
    expected = list(_loader(raw, torch.float32))
    loader = _loader(raw, torch.uint8)
    feeder = DeviceFeeder(loader, "cpu", prefetch=2)
    got = list(feeder)
    assert len(got) == len(expected) > 2
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key, value in e.items():
            if isinstance(value, torch.Tensor):
                assert g[key].dtype == value.dtype, key
                assert g[key].device.type == "cpu"
                assert torch.equal(g[key], value), key
            else:
                assert g[key] == value, key
    assert got[0][CAM].dtype == torch.float32 and got[0][CAM].shape[1:] == (2, 3, 64, 160)
    # The frames asked for, not just equal ones: identity painted into the pixels reads back.
    first = got[0]
    for i in range(len(first["index"])):
        frame = (first[CAM][i, 1] * 255).round().to(torch.uint8)
        assert read_identity(frame) == (int(first["episode_index"][i]), int(first["frame_index"][i]))
    stats = feeder.stats()
    assert stats["batches"] == len(got)
    assert stats["wait_p95_s"] >= stats["wait_p50_s"] >= 0.0
    # Twice over the same feeder: a fresh loader iterator each time, the same epoch again once set
    # (a pass without set_epoch is the next epoch).
    loader.dataset.set_epoch(0)
    assert [b["index"].tolist() for b in feeder] == [b["index"].tolist() for b in expected]


def test_normalize_with_the_dataset_stats(raw: Path) -> None:
    loader = _loader(raw, torch.uint8, num_workers=0)
    stats = loader.dataset.feature_stats
    assert set(stats[CAM]) >= {"mean", "std"}
    plain = list(DeviceFeeder(loader, "cpu"))
    loader.dataset.set_epoch(0)  # each pass the same epoch: compared sample by sample
    normed = list(DeviceFeeder(loader, "cpu", normalize=stats))
    for p, n in zip(plain, normed):
        for key in (CAM, IMG):
            mean = torch.tensor(stats[key]["mean"], dtype=torch.float32)
            std = torch.tensor(stats[key]["std"], dtype=torch.float32)
            assert torch.equal(n[key], (p[key] - mean) / (std + 1e-8)), key
        assert torch.equal(n["action"], p["action"])  # only images by default
    loader.dataset.set_epoch(0)
    state = list(DeviceFeeder(loader, "cpu", normalize=stats, normalize_keys=["observation.state"]))
    mean = torch.tensor(stats["observation.state"]["mean"], dtype=torch.float32)
    std = torch.tensor(stats["observation.state"]["std"], dtype=torch.float32)
    assert torch.equal(state[0]["observation.state"], (plain[0]["observation.state"] - mean) / (std + 1e-8))
    assert torch.equal(state[0][CAM], plain[0][CAM])


def test_early_break_stops_the_thread_and_workers(raw: Path) -> None:
    before = set(multiprocessing.active_children())  # other tests' processes are not this test's business
    feeder = DeviceFeeder(_loader(raw, torch.uint8), "cpu", prefetch=1)
    for n, _ in enumerate(feeder):
        if n == 1:
            break
    assert not _feeder_threads()
    until(
        lambda: not set(multiprocessing.active_children()) - before, "the DataLoader workers shut down"
    )  # the DataLoader workers were shut down
    assert feeder.stats()["batches"] == 2


def test_loader_errors_are_raised_in_the_loop(raw: Path, tmp_path: Path) -> None:
    broken = tmp_path / "ds"
    shutil.copytree(raw, broken)
    (broken / "videos" / CAM / "chunk-000" / "file-002.mp4").write_bytes(b"not an mp4")
    feeder = DeviceFeeder(_loader(broken, torch.uint8), "cpu")
    # the worker's own error, raised in the loop: the episode's mp4 is refused as it is read (SourceError)
    with pytest.raises(SourceError, match=r"DataLoader worker(.|\n)*episode 2: .*file-002\.mp4: not a readable mp4"):
        for _ in feeder:
            pass
    assert not _feeder_threads()


def test_counters_and_clear_errors(raw: Path) -> None:
    batches = [{"x": torch.full((2, 3), i, dtype=torch.uint8), "task": ["a", "b"]} for i in range(5)]
    feeder = DeviceFeeder(batches, "cpu", prefetch=1)
    out = []
    for b in feeder:
        if not out:  # a slow first step: hold batch 0 until the feeder has found its queue full
            until(lambda: feeder.stats()["queue_full"] >= 1, "the feeder's queue full")
        out.append(b)
    assert [b["x"][0, 0].item() for b in out] == [(torch.tensor(float(i)) / 255).item() for i in range(5)]
    assert out[0]["task"] == ["a", "b"]
    assert feeder.stats()["queue_full"] >= 1

    go = threading.Event()

    def slow():
        yield {"x": torch.zeros(1, dtype=torch.uint8)}
        go.wait(timeout=HANG_GUARD_S)  # the loop is already waiting for this one
        yield {"x": torch.ones(1, dtype=torch.uint8)}

    feeder = DeviceFeeder(slow(), "cpu")
    it = iter(feeder)
    next(it)
    loop = threading.get_ident()  # set go once the loop waits on the empty queue for item 1
    threading.Thread(
        target=lambda: (until(lambda: waiting_in(loop, "_get"), "the loop waiting in _get"), go.set()), daemon=True
    ).start()
    assert next(it)["x"].item() == (torch.tensor(1.0) / 255).item()
    stats = feeder.stats()
    assert stats["queue_empty"] >= 1 and stats["batches"] == 2 and stats["wait_max_s"] > 0
    it.close()

    with pytest.raises(ValueError, match="prefetch must be an int >= 1"):
        DeviceFeeder(batches, "cpu", prefetch=0)
    with pytest.raises(ValueError, match="DeviceFeeder device must be 'cpu' or 'cuda'"):
        DeviceFeeder(batches, "tpu")
    with pytest.raises(ValueError, match=r"no mean/std stats for 'nope'"):
        DeviceFeeder(batches, "cpu", normalize={"x": {"mean": [0.0], "std": [1.0]}}, normalize_keys=["nope"])
    with pytest.raises(KeyError, match=r"'y' is not in the batch"):
        list(DeviceFeeder(batches, "cpu", normalize={"y": {"mean": [0.0], "std": [1.0]}}, normalize_keys=["y"]))


def _with_gripper(raw: Path, root: Path) -> Path:
    """A copy of ``raw`` with a uint8 ``observation.gripper`` state (0..255, not an image)."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(raw, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.gripper"] = {"dtype": "uint8", "shape": [1], "names": ["g"]}
    (root / "meta/info.json").write_text(json.dumps(info))
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        values = (np.arange(table.num_rows) * 7 % 256).astype(np.uint8)
        column = pa.array([[int(v)] for v in values], pa.list_(pa.uint8()))
        pq.write_table(table.append_column("observation.gripper", column), path)
    return root


def test_a_uint8_feature_that_is_no_image_keeps_its_values(raw: Path, tmp_path: Path) -> None:
    """Only cameras and image keys become floats in [0, 1]: a uint8 gripper state stays as the float32 loader
    gives it, whichever keys the feeder is told or finds, and in a dataset without any image too."""
    root = _with_gripper(raw, tmp_path / "u8")
    bare = synth_dataset(tmp_path / "bare", num_episodes=2, cameras=(), length_range=(8, 10), seed=5)
    no_images = _with_gripper(bare, tmp_path / "u8-no-images")
    for dataset, keys, window in (
        (root, (CAM, IMG, "observation.gripper"), WINDOW),
        (no_images, ("observation.gripper",), None),
    ):
        expected = list(_loader(dataset, torch.float32, num_workers=0, window=window))
        assert expected[0]["observation.gripper"].dtype == torch.uint8
        loader = _loader(dataset, torch.uint8, num_workers=0, window=window)
        told = DeviceFeeder(iter(loader), "cpu", image_keys=[CAM, IMG])
        for feeder in (DeviceFeeder(_loader(dataset, torch.uint8, num_workers=0, window=window), "cpu"), told):
            got = list(feeder)
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                for key in keys:
                    assert g[key].dtype == e[key].dtype and torch.equal(g[key], e[key]), key
