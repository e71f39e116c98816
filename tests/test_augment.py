"""``image_transforms``: every sample's camera values augmented from a torch generator seeded by the
sample's identity, so an uninterrupted run, a resumed one and another worker or thread layout see
the same augmented frames, and the caller's generator is left alone, also while other threads augment. (LeRobot's own ``ImageTransforms``
through this option: tests/lerobot/test_image_transforms.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.augment import SampleGenerator, UnseededDraw
from lerobot_shards.synth import read_identity, synth_dataset

CAM = "observation.images.front"


def brighten(frames: torch.Tensor) -> torch.Tensor:
    """A random brightness offset from torch's generator (picklable: DataLoader workers run it)."""
    return (frames.int() + int(torch.randint(1, 100, ()))).clamp(0, 255).to(frames.dtype)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return synth_dataset(
        tmp_path_factory.mktemp("augment") / "ds", num_episodes=4, cameras=(CAM,), length_range=(10, 16), seed=2
    )


def _dataset(root: Path, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 1)
    return EpisodePoolDataset(
        str(root), image_dtype=torch.uint8, seed=3, delta_timestamps={CAM: [-1 / 30, 0.0]}, **kwargs
    )


def _samples(loader: DataLoader) -> list[tuple[int, int, torch.Tensor]]:
    return [
        (int(e), int(f), frames) for b in loader for e, f, frames in zip(b["episode_index"], b["frame_index"], b[CAM])
    ]


def test_the_same_sample_is_augmented_the_same_way_under_any_layout_and_resume(raw: Path) -> None:
    plain = {(e, f): x for e, f, x in _samples(DataLoader(_dataset(raw), batch_size=4))}
    full = _samples(DataLoader(_dataset(raw, image_transforms=brighten), batch_size=4))
    offsets = set()
    for e, f, x in full:
        base = plain[(e, f)]
        assert [read_identity(frame) for frame in base][-1] == (e, f)  # the frame asked for, then augmented
        shift = x.int() - base.int()
        unclipped = base < 155
        offsets.add(int(shift[unclipped].flatten()[0]))
        assert (shift[unclipped] == shift[unclipped].flatten()[0]).all()  # one draw for the whole window
    assert len(offsets) > 10  # samples drew their own
    workers = _samples(DataLoader(_dataset(raw, image_transforms=brighten), batch_size=4, num_workers=2))
    by_frame = {(e, f): x for e, f, x in full}
    assert {(e, f) for e, f, _ in workers} == set(by_frame)
    assert all(torch.equal(x, by_frame[(e, f)]) for e, f, x in workers)
    ds = _dataset(raw, image_transforms=brighten)
    resumed = _dataset(raw, image_transforms=brighten)
    resumed.load_state_dict(ds.state_dict(batches_consumed=3, batch_size=4))
    rest = _samples(DataLoader(resumed, batch_size=4))
    assert [(e, f) for e, f, _ in rest] == [(e, f) for e, f, _ in full[12:]]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(rest, full[12:]))


def test_epochs_differ_and_the_callers_generator_is_left_alone(raw: Path) -> None:
    ds = _dataset(raw, image_transforms=brighten)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = {(int(s["episode_index"]), int(s["frame_index"])): s[CAM] for s in ds}  # in this thread
    assert torch.equal(torch.get_rng_state(), before)
    ds.set_epoch(1)
    second = {(e, f): x for e, f, x in _samples(DataLoader(ds, batch_size=4))}
    assert sum(not torch.equal(first[k], second[k]) for k in first) > len(first) // 2


def test_any_decode_threads_and_lookahead_augment_the_same_samples_the_same_way(raw: Path) -> None:
    """The transforms run on the decode pool's shared threads (with ``decode_ahead`` samples ahead,
    as ``lerobot-shards train`` sets it) or inline: the same samples, the same bits."""
    inline = _samples(DataLoader(_dataset(raw, image_transforms=brighten, decode_threads=0), batch_size=4))
    for threads, ahead in [(1, 1), (2, None), (3, 8)]:
        ds = _dataset(raw, image_transforms=brighten, decode_threads=threads, decode_ahead=ahead)
        got = _samples(DataLoader(ds, batch_size=4))
        assert [(e, f) for e, f, _ in got] == [(e, f) for e, f, _ in inline]
        assert all(torch.equal(a[2], b[2]) for a, b in zip(got, inline))


def _draws() -> list[torch.Tensor]:
    """One of each kind of draw torchvision's and LeRobot's transforms make."""
    return [
        torch.rand(3),
        torch.randint(0, 100, (3,)),
        torch.empty(3).uniform_(-1, 1),
        torch.randperm(5),
        torch.multinomial(torch.ones(6), 3),
        torch.randn_like(torch.zeros(2)),
    ]


def test_a_samples_draws_are_its_generators_in_its_thread_alone() -> None:
    """Under ``SampleGenerator`` a thread draws what torch's global generator gives after
    ``manual_seed`` (so the frames are LeRobot's under that seed), while another thread, drawing at
    the same time from the global generator (a training step), is neither moved nor redirected."""
    entered, drawn = threading.Event(), threading.Event()
    inside: list[torch.Tensor] = []

    def augment() -> None:
        with SampleGenerator(torch.Generator().manual_seed(11)):
            entered.set()
            assert drawn.wait(540)  # a hang guard (tests/waits.py), never a speed check
            inside.extend(_draws())

    thread = threading.Thread(target=augment)
    thread.start()
    assert entered.wait(540)
    torch.manual_seed(5)
    training = _draws()  # while the other thread is inside its SampleGenerator
    drawn.set()
    thread.join(540)
    torch.manual_seed(5)
    assert all(torch.equal(a, b) for a, b in zip(training, _draws()))
    torch.manual_seed(11)
    assert len(inside) == 6 and all(torch.equal(a, b) for a, b in zip(inside, _draws()))


def test_a_transform_drawing_from_the_shared_generator_is_refused_in_one_line(raw: Path) -> None:
    def dropped(frames: torch.Tensor) -> torch.Tensor:
        return F.dropout(frames.float(), 0.5).to(frames.dtype)  # takes no generator

    with pytest.raises(UnseededDraw, match=r"^image_transforms: torch.nn.functional.dropout takes no generator"):
        next(iter(_dataset(raw, image_transforms=dropped, decode_threads=2)))
