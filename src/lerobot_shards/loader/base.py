"""What the single dataset and the mixture share: the epoch, the resume state and the windows'
generation in shared memory (``control``), the workers' counters (``stats``), and the part of
their interface a trainer drives.

``EpisodePoolDataset`` and ``MixtureDataset`` differ in what fixes their order (one
``EpochOrder``, or the mixture's schedule over its sources' orders) and in how they read; the
epoch, the resume state saved and loaded through that order, the windows a persistent worker must
not replay stale, and the counters are kept here once. The trainer integration types its dataset
as this base.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from .control import SharedControl
from .meta import DatasetMeta
from .plan.order import EpochOrder, check_count
from .stats import SharedStats, StatSlot
from .transport.slabs import batched_directly


class ResumableDataset(IterableDataset):
    """An IterableDataset whose epochs are reshuffled by ``set_epoch`` and resumed mid-way from
    ``state_dict``, under any worker or rank layout; see ``EpisodePoolDataset`` and ``MixtureDataset``."""

    rank: int
    world_size: int

    def __init__(self) -> None:
        super().__init__()
        self._control = SharedControl()  # epoch, resume state, windows' generation: read by (persistent) workers
        self._stats = SharedStats()
        self._windows = 0  # the windows' generation this copy holds (``_new_windows``)

    # -- what a subclass provides ---------------------------------------------------------------

    @abstractmethod
    def _resume_order(self) -> EpochOrder:
        """The order a resume state records (position, layout, order settings and their digest) and
        is checked against when loaded."""

    @abstractmethod
    def _iterate(
        self, worker: int, num_workers: int, epoch: int, stats: StatSlot, own: bool
    ) -> Iterator[dict[str, Any]]:
        """This worker's samples of ``epoch`` (``own``: the DataLoader batches this very dataset)."""

    @abstractmethod
    def set_delta_timestamps(self, delta_timestamps: Mapping[str, Sequence[float]] | None, tolerance_s: float) -> None:
        """Set the windows, before any iteration (persistent workers started before refuse to go on)."""

    @abstractmethod
    def epoch_samples(self, num_workers: int) -> int:
        """Samples this rank yields this epoch with ``num_workers`` DataLoader workers."""

    @property
    @abstractmethod
    def meta(self) -> DatasetMeta:
        """LeRobot-shaped metadata (``LeRobotDatasetMetadata``'s features, stats, fps, keys, tasks)."""

    @property
    @abstractmethod
    def num_episodes(self) -> int:
        """Episodes read (the chosen ones, of every source)."""

    @property
    @abstractmethod
    def num_frames(self) -> int:
        """Frames of those episodes."""

    # -- epoch and resume -----------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) pass: the one set, plus the passes since (shared with workers)."""
        return self._control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch``; call before each epoch's iterator, like DistributedSampler.

        Works with ``persistent_workers=True`` too: workers read the epoch at every ``__iter__``.
        Without it, each further pass moves to the next epoch (``control``: as MosaicML Streaming).
        """
        self._control.epoch = check_count("epoch", epoch, 0)

    def state_dict(self, batches_consumed: int, batch_size: int) -> dict[str, Any]:
        """The resume state, built by the training loop from the batches it has consumed.

        It records the layout (``world_size``, and the DataLoader's ``num_workers`` as the
        workers reported it; absent before the first iteration) and everything that fixes the
        order (``plan.order.OrderKey``) with its digest, so that resuming under other settings
        fails loudly instead of replaying a different order.
        """
        return self._resume_order().state_dict(
            self.epoch, batches_consumed, batch_size, self._control.seen_workers, self._control.resume
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iterator of ``state['epoch']`` starts after ``batches_consumed`` batches.

        The state is checked whole first (``plan.order.parse_state``): a bad value or another
        order raises one line naming the key, and nothing is changed.
        """
        resume = self._resume_order().load(state)
        self._control.epoch = resume.epoch
        self._control.resume = resume

    # -- iteration ------------------------------------------------------------------------------

    def _new_windows(self) -> None:
        """Count a change of the windows: a persistent worker holding the old ones refuses to iterate."""
        self._windows = self._control.new_windows()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (0, 0) if info is None else (info.id, info.num_workers)
        stale = self._control.stale_windows(self._windows, self._name())
        if stale is not None:
            return stale
        stats = self._stats.slot(worker)
        self._control.saw_workers(num_workers)
        epoch = self._control.begin_pass(worker)  # the epoch set, or the next one on a further pass
        own = batched_directly(self) if info is None else info.dataset is self
        return self._iterate(worker, num_workers, epoch, stats, own=own)

    def _name(self) -> str:
        """How errors about this dataset name it."""
        return type(self).__name__

    # -- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Per-worker and total counters of the last iteration in this process tree (this rank)."""
        return {"rank": self.rank, **self._stats.summary()}
