import numpy as np
import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lerobot_shards.loader.plan.resume import (
    batches_taken_per_worker,
    num_batches,
    resume_point,
    resume_rotation,
    samples_to_skip,
)

# The 3-worker configs exceed this machine's suggested worker count; they are tiny.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class TaggedStream(IterableDataset):
    """Stream s yields (s, i) from i = skips[s]; worker j plays stream (j + rotation) % W."""

    def __init__(self, lengths: list[int], skips: list[int] | None, rotation: int) -> None:
        self.lengths = lengths
        self.skips = skips or [0] * len(lengths)
        self.rotation = rotation

    def __iter__(self):
        info = get_worker_info()
        s = (0 if info is None else info.id + self.rotation) % len(self.lengths)
        for i in range(self.skips[s], self.lengths[s]):
            yield s, i


def run_loader(lengths, num_workers, batch_size, drop_last, skips=None, rotation=0):
    loader = DataLoader(
        TaggedStream(lengths, skips, rotation),
        batch_size=batch_size,
        num_workers=num_workers,
        drop_last=drop_last,
        multiprocessing_context="fork" if num_workers else None,  # fork: fast worker start
    )
    return [list(zip(w.tolist(), i.tolist())) for w, i in loader]


# (samples per worker, DataLoader num_workers, batch size, drop_last)
CONFIGS = [
    ([7], 0, 3, False),
    ([5], 1, 2, False),
    ([5, 0], 2, 2, False),
    ([7, 2, 4], 3, 3, False),
    ([7, 2, 4], 3, 3, True),
    ([1, 6, 3], 3, 2, False),
]


def worker_batch_counts(lengths, batch_size, drop_last):
    return [num_batches(n, batch_size, drop_last) for n in lengths]


@pytest.mark.parametrize(
    "n, b, drop_last, expected",
    [(0, 4, False, 0), (8, 4, False, 2), (9, 4, False, 3), (9, 4, True, 2), (3, 4, True, 0)],
)
def test_num_batches(n, b, drop_last, expected):
    assert num_batches(n, b, drop_last) == expected


def reference_order(worker_batches: list[int]) -> list[int]:
    """The round-robin spelled out: round r yields worker w's r-th batch if it has one."""
    rounds = range(max(worker_batches, default=0))
    return [w for r in rounds for w, c in enumerate(worker_batches) if c > r]


@pytest.mark.parametrize("worker_batches", [[3, 1, 2], [0, 4], [2, 2, 2], [5], [1, 0, 0, 3]])
def test_batches_taken_follows_round_robin(worker_batches):
    order = reference_order(worker_batches)
    for k in range(len(order) + 1):
        expected = [order[:k].count(w) for w in range(len(worker_batches))]
        assert batches_taken_per_worker(k, worker_batches) == expected


def test_rotation_points_at_the_stream_due_next():
    # order for [3, 1, 2]: w0 w1 w2 | w0 w2 | w0
    assert [resume_rotation(k, [3, 1, 2]) for k in range(7)] == [0, 1, 2, 0, 1, 0, 0]


def test_resume_point_rotates_streams_and_skips_theirs():
    # one sample per batch; order w0 w1 w2 | w0 w2 | w0, cut after the first batch
    points = [resume_point([(1, 1)], [3, 1, 2], w) for w in range(3)]
    assert points == [(1, 0), (2, 0), (0, 1)]
    assert resume_point([(3, 1)], [3, 1, 2], 0) == (0, 1)  # round boundary: no rotation


def test_batches_consumed_beyond_epoch_raises():
    with pytest.raises(ValueError, match="outside this epoch, which has 6 batches"):
        batches_taken_per_worker(7, [3, 1, 2])


def test_samples_to_skip_covers_partial_last_batch():
    assert samples_to_skip([(2, 4)], [6, 3], worker=0) == 4
    assert samples_to_skip([(3, 4)], [6, 3], worker=0) == 6  # second batch of worker 0 is partial
    assert samples_to_skip([(3, 4)], [6, 3], worker=1) == 3
    with pytest.raises(ValueError, match="worker must be in"):
        samples_to_skip([(0, 4)], [6, 3], worker=2)


def observed_order(batches) -> list[int]:
    return [batch[0][0] for batch in batches]


def model_order(lengths, batch_size, drop_last) -> list[int]:
    """The worker of each output batch, read off the model's cumulative counts."""
    counts = worker_batch_counts(lengths, batch_size, drop_last)
    taken = [batches_taken_per_worker(k, counts) for k in range(sum(counts) + 1)]
    return [int(np.argmax(np.subtract(b, a))) for a, b in zip(taken, taken[1:])]


@pytest.mark.parametrize("lengths, num_workers, batch_size, drop_last", CONFIGS)
def test_model_reproduces_real_dataloader_order(lengths, num_workers, batch_size, drop_last):
    torch_batches = run_loader(lengths, num_workers, batch_size, drop_last)
    assert observed_order(torch_batches) == model_order(lengths, batch_size, drop_last)
    assert all(len({w for w, _ in batch}) == 1 for batch in torch_batches)


@pytest.mark.parametrize("lengths, num_workers, batch_size, drop_last", CONFIGS)
def test_resume_yields_exactly_the_remaining_batches(lengths, num_workers, batch_size, drop_last):
    full = run_loader(lengths, num_workers, batch_size, drop_last)
    for k in range(len(full) + 1):
        points = [resume_point([(k, batch_size)], lengths, w, drop_last) for w in range(len(lengths))]
        rotation = points[0].stream  # worker j replays stream (j + rotation) % W
        workers = range(len(lengths))
        assert [p.stream for p in points] == [(j + rotation) % len(lengths) for j in workers]
        skips = [0] * len(lengths)
        for p in points:
            skips[p.stream] = p.skip
        resumed = run_loader(lengths, num_workers, batch_size, drop_last, skips, rotation)
        assert resumed == full[k:], f"cut after {k} batches"


def test_resume_without_rotation_would_misorder():
    """Guards the rotation's reason to exist: skipping alone restarts the round at worker 0."""
    lengths, batch_size = [7, 2, 4], 3
    full = run_loader(lengths, 3, batch_size, False)
    skips = [samples_to_skip([(1, batch_size)], lengths, s) for s in range(3)]
    assert run_loader(lengths, 3, batch_size, False, skips) != full[1:]


def _resumed(lengths, num_workers, batch_size, segments):
    """The rest of the epoch a DataLoader of ``batch_size`` yields after ``segments``."""
    points = [resume_point(segments, lengths, w) for w in range(len(lengths))]
    skips = [0] * len(lengths)
    for p in points:
        skips[p.stream] = p.skip
    return run_loader(lengths, num_workers, batch_size, False, skips, points[0].stream)


@pytest.mark.parametrize("lengths, num_workers", [([7], 0), ([7, 2, 4], 3), ([1, 6, 3], 3), ([5, 0], 2)])
def test_resumes_under_changing_batch_sizes_consume_each_sample_once(lengths, num_workers):
    """A run cut at batch size 3, resumed at 2 and cut again, resumed at 4 (or 2 again): every
    sample exactly once, and a second resume at the same size goes on exactly as the first would."""
    everything = sorted((s, i) for s, n in enumerate(lengths) for i in range(n))
    first = run_loader(lengths, num_workers, 3, False)
    for k1 in range(len(first) + 1):
        second = _resumed(lengths, num_workers, 2, [(k1, 3)])
        for k2 in range(len(second) + 1):
            for size in (4, 2):
                third = _resumed(lengths, num_workers, size, [(k1, 3), (k2, 2)])
                if size == 2:
                    assert third == second[k2:], f"cut after {k1} x 3, then {k2} x 2"
                got = [x for batch in [*first[:k1], *second[:k2], *third] for x in batch]
                assert sorted(got) == everything, f"cut after {k1} x 3, then {k2} x 2, then size {size}"
