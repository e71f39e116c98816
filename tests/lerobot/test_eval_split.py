"""``--dataset.eval_split``: the episodes LeRobot 0.6.1's ``make_train_eval_datasets`` holds out, from
converted shards and from the raw source; ``lerobot-shards train`` evaluates them as LeRobot's own
trainer does (the same eval loss, with the weights held still), every held-out frame or the
``--max_eval_samples`` subset."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from procs import CLI, TINY_ACT, env, run

from conftest import Dataset
from lerobot_shards.integrations.eval_split import split_episodes
from lerobot_shards.loader import EpisodePoolDataset

TIMEOUT = 400
LEROBOT_TRAIN = [
    sys.executable,
    "-c",
    "import sys; sys.argv[0] = 'lerobot-train'; from lerobot.scripts.lerobot_train import main; main()",
]
ACT = [
    *TINY_ACT,
    "--policy.device=cpu",
    "--policy.push_to_hub=false",
    "--policy.optimizer_lr=0",  # the weights stay the initial ones: both runs evaluate the same model
    "--policy.optimizer_lr_backbone=0",
]


def _lerobots_split(ds: Dataset, eval_split: float) -> tuple[list[int], list[int]]:
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_train_eval_datasets
    from lerobot.policies.act.configuration_act import ACTConfig

    cfg = TrainPipelineConfig(
        dataset=DatasetConfig(repo_id=ds.repo_id, root=str(ds.raw), eval_split=eval_split),
        policy=ACTConfig(device="cpu", push_to_hub=False),
    )
    train, held = make_train_eval_datasets(cfg)
    return list(train.episodes), list(held.episodes)


@pytest.mark.parametrize("source", ["shards", "raw"])
@pytest.mark.parametrize("eval_split", [0.34, 0.5])
def test_the_held_out_episodes_are_lerobots(written: Dataset, source: str, eval_split: float) -> None:
    ours = EpisodePoolDataset(str(written.shards if source == "shards" else written.raw))
    tasks = ours.episode_tasks()
    assert split_episodes(sorted(tasks), tasks, eval_split) == _lerobots_split(written, eval_split)


@pytest.mark.parametrize("max_eval_samples", [0, 5])
def test_the_eval_loss_is_lerobots(written: Dataset, tmp_path: Path, max_eval_samples: int) -> None:
    """Every held-out frame, or ``--max_eval_samples``: LeRobot's per-task subset of them; evaluated
    twice, the second time from the decoded-frame cache the first filled (on by itself in train)."""
    args = [
        f"--dataset.repo_id={written.repo_id}",
        f"--dataset.root={written.raw}",
        "--dataset.eval_split=0.5",
        *ACT,
        "--batch_size=8",
        "--steps=2",
        "--eval_steps=1",
        f"--max_eval_samples={max_eval_samples}",
        "--save_checkpoint=false",
        "--num_workers=0",
        "--seed=7",
        "--wandb.enable=false",
    ]
    losses = {}
    for name, cmd in (("ours", [*CLI, "train"]), ("lerobot", LEROBOT_TRAIN)):
        environ = env(TMPDIR=str(tmp_path))  # the frame cache starts empty: the first evaluation fills it
        log = run([*cmd, *args, f"--output_dir={tmp_path / name}"], tmp_path / f"{name}.txt", environ, TIMEOUT)
        losses[name] = re.findall(r"step [12]: eval_loss=([0-9.]+)", log)
    ours = (tmp_path / "ours.txt").read_text()
    assert "train/eval split: 1 train, 2 eval episodes" in ours
    assert re.search(r"decoded-frame cache on in .*, with the 2 held-out episodes", ours)
    assert ("frames of each of" in ours) == bool(max_eval_samples)
    assert len(losses["ours"]) == 2 and losses["ours"] == losses["lerobot"]
