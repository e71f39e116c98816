"""``split_episodes``: LeRobot's eval split (the last ceil(n x eval_split) episodes of each first task held
out). tests/lerobot/test_eval_split.py compares it with LeRobot's own ``make_train_eval_datasets``."""

from __future__ import annotations

import pytest

from lerobot_shards.integrations.eval_split import eval_subset, split_episodes


def test_the_last_episodes_of_each_first_task_are_held_out() -> None:
    tasks = {0: ["a"], 1: ["b", "a"], 2: ["a"], 3: ["a", "b"], 4: [], 5: ["b"], 6: ["a"]}
    # by first task: a: 0 2 3 6, b: 1 5, none: 4 (groups in order of their first episode)
    assert split_episodes(range(7), tasks, 0.25) == ([0, 2, 3, 1], [6, 5, 4])
    assert split_episodes(range(7), tasks, 0.5) == ([0, 2, 1], [3, 6, 5, 4])
    assert split_episodes([6, 3, 2, 0], tasks, 0.25) == ([6, 3, 2], [0])  # the order given, as LeRobot's


def test_max_eval_samples_takes_the_first_frames_of_each_task_by_task_index() -> None:
    tasks = {3: ["b"], 5: ["a", "b"], 6: ["a"], 8: ["c"]}
    index = {"a": 2, "b": 0, "c": 1, "d": 3}  # d: in no held-out episode
    assert eval_subset([8, 6, 5, 3], tasks, index, 7) == (2, [(0, [3, 5]), (1, [8]), (2, [5, 6])])
    assert eval_subset([3], tasks, index, 1) == (1, [(0, [3])])
    assert eval_subset([3, 8], tasks, index, 1) == (1, [(0, [3]), (1, [8])])  # at least one frame per task


def test_a_split_leaving_no_training_episode_is_refused() -> None:
    with pytest.raises(ValueError, match=r"eval_split=0.5 leaves 0 training episodes from 2 total"):
        split_episodes([0, 1], {0: ["a"], 1: ["b"]}, 0.5)
    with pytest.raises(ValueError, match=r"eval_split must be in \(0, 1\)"):
        split_episodes([0, 1], {0: ["a"], 1: ["a"]}, 1.0)


def test_converted_episodes_keep_their_tasks_and_a_changed_header_is_refused(small_synth, tmp_path) -> None:
    """The key of the split: a converted episode's tasks (its header member) equal the raw source's."""
    from lerobot_shards.convert.run import convert_dataset
    from lerobot_shards.loader import EpisodePoolDataset
    from lerobot_shards.loader.read.integrity import IntegrityError

    out = tmp_path / "shards"
    convert_dataset(small_synth, out, progress=False)
    raw = EpisodePoolDataset(str(small_synth)).episode_tasks()
    assert EpisodePoolDataset(str(out)).episode_tasks() == raw and len(raw) == 4
    assert EpisodePoolDataset(str(out), episodes=[1, 3]).episode_tasks() == {e: raw[e] for e in (1, 3)}
    tar = next((out / "shards").glob("*.tar"))
    data = bytearray(tar.read_bytes())
    at = data.index(b'"tasks"')
    data[at + 1] = ord("T")  # the same size, another header
    tar.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"episode \d+: member .*\.json does not match its checksum"):
        EpisodePoolDataset(str(out)).episode_tasks()
