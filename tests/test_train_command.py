"""``lerobot-shards train`` where LeRobot is absent (this host: Python 3.11) and its pure layout choice.

Training itself runs against real LeRobot in tests/lerobot/test_train.py.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from lerobot_shards.integrations.lerobot_train import (
    _equal_samples_per_rank,
    _fit_layout,
    _is_our_source,
    _logged,
    choose_layout,
    decode_ahead,
    opened_line,
)
from waits import HANG_GUARD_S


def test_without_lerobot_one_line_names_the_supported_versions_and_the_install() -> None:
    try:  # (not `import lerobot`: tests/lerobot/ on sys.path would import as a namespace package)
        importlib.metadata.version("lerobot")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.fail("this host test expects no LeRobot (tests/lerobot/ runs where LeRobot is)")
    proc = subprocess.run(
        [sys.executable, "-m", "lerobot_shards.cli", "train", "--policy.type=act"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,  # a hang guard only: the start imports torch, over 60 s at load 50
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "LeRobot 0.6.x" in lines[0] and 'pip install "lerobot[training]==0.6.1"' in lines[0]


@pytest.mark.parametrize(
    ("cpus", "ranks", "want"),
    [
        (2, 1, (0, 2)),
        (2, 2, (0, 1)),
        (4, 1, (0, 4)),
        (5, 1, (2, 2)),
        (16, 1, (8, 2)),
        (16, 2, (4, 2)),
        (64, 8, (4, 2)),
        (32, 1, (8, 4)),
        (256, 1, (8, 8)),
        (1, 4, (0, 1)),
    ],
)
def test_layout_choice(cpus: int, ranks: int, want: tuple[int, int]) -> None:
    assert choose_layout(cpus, ranks) == want


def test_the_chosen_layout_never_gives_the_ranks_more_workers_than_episodes() -> None:
    """8 ranks of 12 cores chose 6 workers each: with 40 episodes the loader refused at the first batch."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(num_workers=6)
    line = _fit_layout(cfg, SimpleNamespace(num_episodes=40, world_size=8), 12)
    assert cfg.num_workers == 5 and "fewer than the 6 for its cores: 5 episodes per rank" in line
    cfg.num_workers = 6
    _fit_layout(cfg, SimpleNamespace(num_episodes=4, world_size=2), 12)
    assert cfg.num_workers == 2
    cfg.num_workers = 3
    _fit_layout(cfg, SimpleNamespace(num_episodes=3, world_size=2), 6)  # one episode per rank: no workers
    assert cfg.num_workers == 0
    cfg.num_workers = 3
    mixture = SimpleNamespace(world_size=1, sources=[SimpleNamespace(num_episodes=9), SimpleNamespace(num_episodes=2)])
    _fit_layout(cfg, mixture, 6)
    assert cfg.num_workers == 2  # its smallest source's
    cfg.num_workers = 3
    assert "fewer" not in _fit_layout(cfg, SimpleNamespace(num_episodes=100, world_size=2), 6)


def test_without_workers_a_batch_is_prepared_ahead_and_the_layout_line_says_so() -> None:
    """No DataLoader workers: the step runs in the iterating thread, so the decode threads get a
    batch to decode and augment during it; with workers, their prefetched batches overlap already."""
    from types import SimpleNamespace

    assert decode_ahead(0, 8) == 8 and decode_ahead(2, 8) is None
    line = _fit_layout(SimpleNamespace(num_workers=0), SimpleNamespace(num_episodes=4, world_size=1), 2, 8)
    assert line.startswith("num_workers=0, decode_threads=2, decode_ahead=8 (a batch, prepared during each step)")


def test_equal_counts_per_rank_follow_the_setting_then_the_checkpoint() -> None:
    """A checkpoint resumed on another number of processes keeps its setting (else the loader's
    default flips with the world size and the resume is refused, advising a keyword the command lacks)."""
    assert _equal_samples_per_rank(None, None, 2) is None
    assert _equal_samples_per_rank(None, {"equal_samples_per_rank": True}, 1) is True  # 2 processes -> 1
    assert _equal_samples_per_rank(None, {"equal_samples_per_rank": True}, 8) is True
    assert _equal_samples_per_rank(None, {"equal_samples_per_rank": False}, 1) is False
    # one process -> several: ranks would run different batch counts and drift apart (helper review)
    with pytest.raises(ValueError, match="saved by one process.*resumed on 2 processes they would drift apart"):
        _equal_samples_per_rank(None, {"equal_samples_per_rank": False}, 2)
    assert _equal_samples_per_rank(True, {"equal_samples_per_rank": False}, 1) is True  # --shards.equal_... wins


def test_an_unfinished_conversion_or_its_shards_folder_is_named(tmp_path) -> None:
    (tmp_path / "convert.json").write_text("{}")
    with pytest.raises(ValueError, match="holds an unfinished conversion"):
        _is_our_source(str(tmp_path), None)
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "shards").mkdir()
    assert _is_our_source(str(tmp_path), None)
    with pytest.raises(ValueError, match=f"shards/ folder: give the conversion itself, {tmp_path}"):
        _is_our_source(str(tmp_path / "shards"), None)
    assert not _is_our_source(str(tmp_path / "elsewhere"), None)


def test_the_sample_log_names_a_mixtures_source() -> None:
    import torch

    assert _logged({"index": torch.tensor([3, 4])}) == ["3", "4"]
    assert _logged({"index": torch.tensor([3, 3]), "dataset_index": torch.tensor([0, 1])}) == ["0:3", "1:3"]


def test_the_opened_dataset_line_holds_no_credentials() -> None:
    """A dataset URL with a ``user:password@`` is used with them, but train printed it whole into
    the run's log (kept, shared)."""
    from types import SimpleNamespace

    ds = SimpleNamespace(num_episodes=4, num_frames=100, rank=0, world_size=1)
    line = opened_line("https://me:tok-5c1e7@mirror.example/so101", ds, "num_workers=0")
    assert line == "lerobot-shards train: https://mirror.example/so101: 4 episodes, 100 frames, rank 0/1; num_workers=0"
