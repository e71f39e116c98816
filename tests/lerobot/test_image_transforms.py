"""``--dataset.image_transforms.enable=true``: LeRobot 0.6.1's own ``ImageTransforms`` on our samples
gives exactly what LeRobot's dataset gives under the same generator state (the sample's seed), and a
run with transforms on, resumed from its step-4 checkpoint with DataLoader workers, ends with the
uninterrupted run's weights (LeRobot's own workers would draw other parameters after a resume)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from procs import CLI, env, run
from test_train import ACT, TIMEOUT, _args, _weights_hash

from conftest import Dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.augment import sample_seed

CAM = "observation.images.cam"


@pytest.mark.parametrize("exact_kernels", [False, True])
def test_lerobots_transforms_on_our_samples_are_lerobots_samples(written: Dataset, exact_kernels: bool) -> None:
    """Also through ``ExactKernels`` (the trainer's: torchvision's costliest kernels, cheaper)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.transforms import ImageTransforms, ImageTransformsConfig

    from lerobot_shards.integrations.image_kernels import ExactKernels

    transforms = ImageTransforms(ImageTransformsConfig(enable=True, random_order=True))
    deltas = {CAM: [-1 / 30, 0.0]}
    kw = dict(delta_timestamps=deltas, image_dtype=torch.uint8, seed=5, cameras=[CAM])
    ours = EpisodePoolDataset(
        str(written.shards), image_transforms=ExactKernels(transforms) if exact_kernels else transforms, **kw
    )
    plain = {int(s["index"]): s[CAM] for s in EpisodePoolDataset(str(written.shards), **kw)}
    theirs = LeRobotDataset(
        written.repo_id, root=written.raw, delta_timestamps=deltas, image_transforms=transforms, return_uint8=True
    )
    changed = 0
    for sample in itertools.islice(ours, 40):
        index = int(sample["index"])
        torch.manual_seed(sample_seed(5, 0, int(sample["episode_index"]), int(sample["frame_index"])))
        want = theirs[index][CAM]
        assert want.dtype == sample[CAM].dtype == torch.uint8 and torch.equal(sample[CAM], want), index
        changed += not torch.equal(sample[CAM], plain[index])
    assert changed > 30


def test_a_resumed_run_with_transforms_ends_with_the_same_weights(written: Dataset, tmp_path: Path) -> None:
    args = [
        *_args(str(written.raw), tmp_path / "a", ACT, steps=8, save_freq=4),
        "--batch_size=4",
        "--num_workers=2",
        "--dataset.image_transforms.enable=true",
    ]
    log = run([*CLI, "train", *args], tmp_path / "a.txt", env(), TIMEOUT)
    assert "lerobot-shards train: LeRobot's ImageTransforms (brightness, contrast" in log
    b = tmp_path / "b"  # the run as it stood after its step-4 checkpoint, as if killed there
    shutil.copytree(tmp_path / "a", b, symlinks=True)
    shutil.rmtree(b / "checkpoints/000008")
    (b / "checkpoints/last").unlink()
    (b / "checkpoints/last").symlink_to("000004")
    config = b / "checkpoints/000004/pretrained_model/train_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "output_dir": str(b)}))
    run([*CLI, "train", "--resume=true", f"--config_path={config}"], tmp_path / "b.txt", env(), TIMEOUT)
    assert _weights_hash(b / "checkpoints/000008") == _weights_hash(tmp_path / "a/checkpoints/000008")
