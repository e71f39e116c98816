"""Batches from DataLoader workers to the main process through reused shared-memory slabs.

The stock DataLoader's default collate puts every batch of a worker into freshly allocated shared
memory, one segment per key, which the main process then maps afresh: every batch's pages are
faulted in anew in both processes, and on a virtual machine that cost several ms of CPU per sample
beside ~12 ms of decoding two 480p cameras (benchmarks/README.md). ``SlabCollate`` keeps a small
ring of preallocated shared-memory slabs per worker instead:

- the worker's collate stacks every tensor of the batch straight into one free slab (one copy, as
  the default collate makes) and returns a ``SlabBatch``: a descriptor of the slab, its generation
  and where each key lies in it, plus the non-tensor values (``task`` strings);
- the descriptor travels through the DataLoader's own queue; torch pickles the slab's storage as a
  file descriptor, and the main process, which keeps every slab it has seen mapped, finds the
  mapping in torch's sharing cache instead of mapping it again; unpickling (``_rebuild``) wraps the
  slab as tensor views, so the batch the loop receives is a plain ``dict`` of tensors, no copy;
- a slab is busy from the moment the worker takes it until no tensor of its batch is alive in the
  main process any more: the batch's tensors are views of one tensor whose memory is owned by a
  small lease object (numpy's ``__array_interface__``), and when the last view dies the lease is
  collected and writes "free" into the slab's own header, which the worker reads before it takes
  a slab. A slab whose batch (or any view or slice of it) is still held is never written;
- a worker whose slabs are all busy (the loop holds many batches) stacks that batch into new
  shared memory, as the default collate does, laid out as in a slab (counted as
  ``fallback_batches``): the transport never blocks or deadlocks;
- a dataset that knows (``Staging``) writes its decoded frames straight into their place in the
  slab their batch will travel in, reserved for that batch, so collation finds them there: with
  float32 images no intermediate tensor is made at all. Values found out of place are copied as
  before, and a slab still viewed by a sample kept in the worker is replaced, never rewritten.

Without workers (``num_workers=0``) there is no transport, but the same ring pays off: the main
process keeps its own slabs (plain memory) and hands each batch out as views of one, leased as
above. A fresh 59 MB batch of two 480p cameras costs its page faults at every batch (on a virtual
machine ~1 ms of CPU per sample), and a dataset ``slab_loader`` batches directly has its decode
threads read frames straight into the batch (``Staging``), so the main thread, which otherwise
copies every frame once more to collate it, only assembles samples.

With ``pin_memory=True`` on a CUDA host, the main process page-locks each slab once
(``cudaHostRegister``) so that the DataLoader's ``pin_memory`` finds its tensors already pinned and
copies nothing; a pinned slab is marked free only after a CUDA event recorded at release time on
the current stream has completed, so a ``non_blocking`` copy from it on that stream has finished
(checked on an H200: ``benchmarks/gpu_check.py``'s ``slab`` section; docs/transport.md).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import multiprocessing
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

HEADER_BYTES = 64  # each slab starts with int64 [state, generation]
ALIGN = 64  # every tensor in a slab starts on a cache line
FREE, BUSY = 0, 1
Layout = Literal["sample", "contiguous"]
MAX_WORKERS = 64  # counter rows (as loader.stats)
WORKER_FIELDS = (
    "batches",
    "samples",
    "slab_batches",
    "fallback_batches",
    "slabs_allocated",
    "slab_bytes",
    "collate_cpu_s",
    "staged_values",
    "stage_cpu_s",
    "slabs_retired",
)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The whole slab as one uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _header(storage: torch.UntypedStorage) -> torch.Tensor:
    """The slab's [state, generation]."""
    return _bytes(storage)[:16].view(torch.int64)


def _view(base: torch.Tensor, f: _Field) -> torch.Tensor:
    """Field ``f`` of a leased slab (``base``: the whole slab as uint8), sharing its memory."""
    nbytes = math.prod(f.shape) * _itemsize(f.dtype)
    return base[f.offset : f.offset + nbytes].view(f.dtype).as_strided(f.shape, f.stride)


_use_count = getattr(torch._C, "_storage_Use_Count", None)  # torch's own (cudagraph trees use it)


def _viewed_here(slab: _Slab) -> bool:
    """Whether a tensor of this process other than the ring's own (the storage and its header)
    still views the slab: a staged value kept beyond its batch (a wrapper caching samples), whose
    memory must then never be written again."""
    return _use_count is not None and _use_count(slab.storage._cdata) > 2


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _batch_stride(sample: torch.Tensor, layout: Layout) -> tuple[int, ...]:
    """Strides of tensors like ``sample`` stacked along a new first dimension.

    With ``layout="sample"`` a dense ``sample`` keeps its own memory order (its dimensions sorted
    by stride): a frame torchcodec decoded is CHW-shaped over HWC memory, and stacking it in that
    order is a plain copy where a contiguous CHW batch costs a transposing one (~0.5 ms per 480p
    frame, about a tenth of the CPU a sample takes). Otherwise, and for a sample with gaps or
    overlaps, the batch is contiguous, as torch's ``default_collate`` makes it.
    """
    order = list(range(sample.dim()))
    if layout == "sample":
        strides = sample.stride()
        by_stride = sorted(order, key=lambda d: -strides[d])  # stable: ties keep their order
        if sample.permute(by_stride).is_contiguous():
            order = by_stride
    stride = [0] * sample.dim()
    step = 1
    for d in reversed(order):
        stride[d] = step
        step *= sample.shape[d]
    return (step, *stride)


@dataclass(frozen=True)
class _Field:
    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # in elements, the batch dimension first
    offset: int  # bytes from the start of the slab


class SlabCollate:
    """A DataLoader ``collate_fn`` whose worker batches travel in reused shared-memory slabs.

    Args:
        slabs: slabs per worker, each holding one batch, allocated only when every existing one
            is busy. A worker has at most ``prefetch_factor`` batches in flight (some may wait in
            the DataLoader's reorder buffer) and the loop holds one, so ``prefetch_factor + 2``
            slabs (``slab_loader``'s choice) avoid fallbacks in a loop that keeps no batch.
        pin_memory: page-lock each slab once in the main process on a CUDA host, so that the
            DataLoader's ``pin_memory=True`` copies nothing.
        collate: how to collate what is not a tensor of the same shape and dtype in every
            sample, and the whole batch when no slab is free: torch's ``default_collate``, whose
            values the slab path reproduces bit for bit.
        layout: ``"sample"`` stacks each tensor in its samples' own memory order (frames decoded
            channels-last give batches shaped ``[..., C, H, W]`` whose memory is channels-last,
            as FFCV's ``ToTorchImage(channels_last=True)``): one plain copy per batch, where the
            contiguous layout costs a transposing copy of every frame. ``"contiguous"``: the
            layout ``default_collate`` gives. Values are the same either way; ``.reshape`` (not
            ``.view``) or ``.contiguous()`` where code needs contiguous memory. ``DeviceFeeder``
            makes floats contiguous on the device as it converts them.
        drop: keys left out of every batch, as LeRobot's ``lerobot_collate_fn`` leaves out its
            language columns (``lerobot_shards.language.LANGUAGE_COLUMNS``).
        lists: keys whose batch value is the plain list of the samples' values (language rows,
            which ``default_collate`` cannot collate: lists of different lengths).

    Samples must be mappings (as ``EpisodePoolDataset`` emits); others are collated by
    ``collate`` (counted as fallbacks). In the main process (``num_workers=0``) the batch is
    stacked into a slab of the main process's own ring (plain memory, never pinned: the
    DataLoader's ``pin_memory`` copies it) and handed out as views of it, freed as a worker's
    slab is; ``batched_directly`` lets a dataset stage into it. Use one ``SlabCollate`` per
    DataLoader.
    """

    def __init__(
        self,
        slabs: int = 4,
        *,
        pin_memory: bool = False,
        collate: Callable[[list[Any]], Any] = default_collate,
        layout: Layout = "sample",
        drop: Collection[str] = (),
        lists: Collection[str] = (),
    ) -> None:
        if isinstance(slabs, bool) or not isinstance(slabs, int) or slabs < 1:
            raise ValueError(f"slabs must be an int >= 1 (slabs per worker), got {slabs!r}")
        if layout not in ("sample", "contiguous"):
            raise ValueError(f"layout must be 'sample' or 'contiguous', got {layout!r}")
        self.slabs = slabs
        self.pin_memory = bool(pin_memory)
        self.collate = collate
        self.layout: Layout = layout
        self.drop, self.lists = frozenset(drop), frozenset(lists)
        self._counters = multiprocessing.Array("d", MAX_WORKERS * len(WORKER_FIELDS), lock=False)
        self._ring: _Ring | None = None  # this process's, made in the worker

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ring"] = None  # a spawned worker makes its own
        return state

    def __call__(self, samples: list[Any]) -> Any:
        if isinstance(samples, Mapping) and self.collate is default_collate:
            raise TypeError(
                "SlabCollate collates batches (a list of samples), got one sample: use it with a batch_size "
                "(batch_size=None hands the collate_fn single samples)"
            )
        if (self.drop or self.lists) and all(isinstance(s, Mapping) for s in samples):
            samples = [
                {k: _AsIs(v) if k in self.lists else v for k, v in s.items() if k not in self.drop} for s in samples
            ]
        info = get_worker_info()
        ring = self._ring_here(info)
        return ring.pack(samples, self.collate, self.pin_memory and info is not None, self.layout)

    def _ring_here(self, info: Any) -> _Ring:
        """This process's ring (made, and made the one its staging writes into, on first use)."""
        if self._ring is None or self._ring.pid != os.getpid():
            if info is not None and not 0 <= info.id < MAX_WORKERS:
                raise ValueError(f"SlabCollate supports at most {MAX_WORKERS} DataLoader workers")
            # the main process (no workers) counts in worker 0's row: it is the only producer then
            self._ring = _Ring(self.slabs, self._counters, 0 if info is None else info.id, local=info is None)
            _set_worker_ring(self._ring)
        return self._ring

    def stats(self) -> dict[str, Any]:
        """The workers' counters summed over this DataLoader's workers (batches and samples
        collated, batches through slabs, fallbacks, slabs and bytes allocated, collate CPU seconds)
        and the main process's (batches rebuilt, slabs mapped, dropped, held and leased now, CPU
        seconds rebuilding; process-wide: every ``SlabCollate`` of this process together)."""
        n = len(WORKER_FIELDS)
        rows = [dict(zip(WORKER_FIELDS, self._counters[w * n : (w + 1) * n])) for w in range(MAX_WORKERS)]
        total = {f: sum(r[f] for r in rows) for f in WORKER_FIELDS}
        return {"workers": total, "main": _registry().stats()}


def slab_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    num_workers: int,
    prefetch_factor: int = 2,
    slabs: int | None = None,
    pin_memory: bool = False,
    layout: Layout = "sample",
    drop: Collection[str] = (),
    lists: Collection[str] = (),
    **kwargs: Any,
) -> DataLoader[Any]:
    """A stock ``DataLoader`` with ``SlabCollate`` as its ``collate_fn`` (``slabs`` default:
    ``prefetch_factor + 2``; ``layout``, ``drop`` and ``lists`` as ``SlabCollate``'s); every other
    keyword goes to the DataLoader as is. Without workers it records that it batches ``dataset``
    itself (``batched_directly``), so that the dataset may stage its frames into the batch."""
    collate = SlabCollate(
        prefetch_factor + 2 if slabs is None else slabs, pin_memory=pin_memory, layout=layout, drop=drop, lists=lists
    )
    extra = dict(kwargs)
    if num_workers:
        extra["prefetch_factor"] = prefetch_factor
    else:
        _batches_directly(dataset, collate)
    return DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate, pin_memory=pin_memory, **extra
    )


def with_slabs(
    loader: DataLoader[Any], slabs: int | None = None, layout: Layout = "sample", drop: Collection[str] | None = None
) -> DataLoader[Any]:
    """``loader`` itself, or, when it collates with torch's default (``collate_fn`` unset or
    ``default_collate``), the same DataLoader with ``SlabCollate`` (``slabs`` default:
    ``prefetch_factor + 2``, or 4 without workers; ``layout`` as ``SlabCollate``'s) and every other
    setting kept; without workers its dataset is batched directly (``batched_directly``). With
    ``drop``, the loader's ``collate_fn`` is taken to be ``default_collate`` once those keys are left
    out (LeRobot's ``lerobot_collate_fn`` on samples of ours: the caller knows which it is), and the
    loader is rebuilt with ``SlabCollate(drop=drop)``. For a loader built by someone else (a
    trainer), before its first iterator; iterable datasets only (a map-style loader's sampler
    is not carried over).

    With ``pin_memory=True`` (LeRobot's trainer sets it on CUDA) the slabs are page-locked
    (``SlabCollate(pin_memory=True)``): the pin thread then finds every batch pinned and copies
    nothing, where it would otherwise copy each batch out of its slab.
    """
    if loader.collate_fn is not default_collate and drop is None:
        return loader
    if not isinstance(loader.dataset, IterableDataset):
        raise TypeError("with_slabs: only a DataLoader over an IterableDataset is rebuilt (its sampler is not carried)")
    prefetch = loader.prefetch_factor or 2
    extra: dict[str, Any] = {"in_order": loader.in_order} if hasattr(loader, "in_order") else {}  # torch >= 2.6
    collate = SlabCollate(
        prefetch + 2 if slabs is None else slabs, pin_memory=loader.pin_memory, layout=layout, drop=drop or ()
    )
    if not loader.num_workers:
        _batches_directly(loader.dataset, collate)
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        drop_last=loader.drop_last,
        num_workers=loader.num_workers,
        collate_fn=collate,
        pin_memory=loader.pin_memory,
        pin_memory_device=loader.pin_memory_device,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        **extra,
    )


@dataclass(frozen=True)
class SlabBatch:
    """What crosses the DataLoader queue: a slab (pickled by torch as a file descriptor) and its layout.

    Unpickled in the main process it becomes the batch itself (``_rebuild``), a ``dict``.
    """

    storage: torch.UntypedStorage
    slab: tuple[int, int, int]  # (worker pid, transport token, slab index)
    generation: int
    fields: tuple[_Field, ...]
    others: dict[str, Any]
    order: tuple[str, ...]
    pin: bool

    def __reduce__(self) -> tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]:
        return _rebuild, tuple(getattr(self, f.name) for f in dataclasses.fields(self))


@dataclass
class _Slab:
    storage: torch.UntypedStorage
    header: torch.Tensor  # this worker's view of [state, generation]
    nbytes: int  # capacity after the header


@dataclass
class _Reserved:
    """A slab taken (busy) for a batch not collated yet, and how many values were staged in it."""

    index: int
    slab: _Slab
    assigned: int = 0  # values given a slot in it (``destination``)
    keys: set[str] = dataclasses.field(default_factory=set)


@dataclass(frozen=True)
class _AsIs:
    """A sample's value of a ``lists`` key, which the batch carries in a plain list."""

    value: Any


@dataclass
class _Batch:
    """A batch of mapping samples, planned: which keys stack as tensors (in what strides), the rest collated."""

    order: tuple[str, ...]
    tensors: list[tuple[str, list[torch.Tensor], tuple[int, ...]]]  # key, values, batch strides
    others: dict[str, Any]

    @classmethod
    def plan(cls, samples: list[Any], collate: Callable[[list[Any]], Any], layout: Layout) -> _Batch | None:
        """``None`` unless every sample is a mapping (those batches go to ``collate`` whole)."""
        if not samples or not all(isinstance(s, Mapping) for s in samples):
            return None
        order = tuple(samples[0])
        tensors: list[tuple[str, list[torch.Tensor], tuple[int, ...]]] = []
        others: dict[str, Any] = {}
        for key in order:
            values = [s[key] for s in samples]  # a key missing from a sample raises, as in default_collate
            first = values[0]
            if isinstance(first, _AsIs):
                others[key] = [v.value for v in values]
            elif (
                isinstance(first, torch.Tensor)
                and first.device.type == "cpu"
                and first.layout == torch.strided
                and all(
                    isinstance(v, torch.Tensor)
                    and v.dtype == first.dtype
                    and v.shape == first.shape
                    and v.device == first.device
                    and v.layout == torch.strided
                    and not v.requires_grad  # stack(out=...) records no autograd: default_collate's then
                    for v in values
                )
            ):
                tensors.append((key, values, _batch_stride(first, layout)))
            else:
                others[key] = collate(values)
        return cls(order, tensors, others)


def _stack(samples: list[Any], collate: Callable[[list[Any]], Any], layout: Layout, shared: bool = False) -> Any:
    """The batch laid out as the slab path lays it out, in fresh memory, when every slab of the ring
    is busy: in a worker (``shared``: in new shared memory, as ``default_collate`` allocates it
    there), or in the main process without workers (``default_collate`` there would keep a window's
    channels-last order even for ``"contiguous"``): a batch that falls back has the same layout."""
    batch = _Batch.plan(samples, collate, layout)
    if batch is None:
        return collate(samples)
    stacked = {
        key: torch.stack(values, out=_fresh((len(values), *values[0].shape), stride, values[0].dtype, shared))
        for key, values, stride in batch.tensors
    }
    return {key: stacked[key] if key in stacked else batch.others[key] for key in batch.order}


def _fresh(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    if not shared:
        return torch.empty_strided(shape, stride, dtype=dtype)
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
    storage = torch.UntypedStorage._new_shared(extent * _itemsize(dtype))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, stride)


class _Ring:
    """One worker's slabs, allocated as needed up to ``capacity``."""

    def __init__(self, capacity: int, counters: Any, worker: int, local: bool = False) -> None:
        self.capacity = capacity
        self.local = local  # the main process's own (no workers): plain memory, batches lent as views
        self.pid = os.getpid()
        self.token = secrets.randbits(62)  # tells this worker's slabs from a restarted worker's
        self.slabs: list[_Slab] = []
        self._counters = counters
        self._base = worker * len(WORKER_FIELDS)
        # staging (``destination``): the layout of the first batch, and the batches of this
        # iteration counted as they are collated, each with the slab reserved for it if any
        self._plan: tuple[_Field, ...] | None = None
        self._batch_size = 0
        self._plan_bytes = 0
        self._staging = True
        self._collated = 0
        self._reserved: dict[int, _Reserved] = {}
        self._stage_lock = threading.RLock()  # reentrant: a stream collected inside it may close its staging
        self._stat_lock = threading.Lock()

    def _add(self, name: str, value: float) -> None:
        self._counters[self._base + WORKER_FIELDS.index(name)] += value

    def pack(self, samples: list[Any], collate: Callable[[list[Any]], Any], pin: bool, layout: Layout) -> Any:
        start = time.thread_time()
        try:
            return self._pack(samples, collate, pin, layout)
        finally:
            self._add("batches", 1)
            self._add("samples", len(samples))
            self._add("collate_cpu_s", time.thread_time() - start)

    def _pack(self, samples: list[Any], collate: Callable[[list[Any]], Any], pin: bool, layout: Layout) -> Any:
        batch = _Batch.plan(samples, collate, layout)
        fields, offset = [], HEADER_BYTES
        for key, values, stride in batch.tensors if batch is not None else ():
            fields.append(_Field(key, values[0].dtype, (len(values), *values[0].shape), stride, offset))
            offset += _align(values[0].element_size() * values[0].numel() * len(values))
        with self._stage_lock:  # a dataset may stage from another thread of this worker
            reserved, placed, fields = self._claim_staged(batch, fields, offset - HEADER_BYTES)
            found = (
                None
                if batch is None
                else (reserved.index, reserved.slab)
                if reserved
                else self._acquire(offset - HEADER_BYTES)
            )
        if batch is None or found is None:
            self._add("fallback_batches", 1)
            return collate(samples) if batch is None else _stack(samples, collate, layout, shared=not self.local)
        index, slab = found
        generation = int(slab.header[1]) + 1
        slab.header[1] = generation
        base = _bytes(slab.storage)
        for f, (key, values, _) in zip(fields, batch.tensors):
            out = _view(base, f)
            done = placed.get(key)
            if done is None:
                torch.stack(values, out=out)
                continue
            for i, value in enumerate(values):
                if i not in done:
                    out[i].copy_(value)
        self._add("slab_batches", 1)
        self._add("staged_values", sum(len(done) for done in placed.values()))
        if self.local:
            return _lend(slab, generation, fields, batch.others, batch.order)
        return SlabBatch(
            slab.storage, (self.pid, self.token, index), generation, tuple(fields), batch.others, batch.order, pin
        )

    # -- staging: values written straight into the slab their batch will travel in ----------------

    def _claim_staged(
        self, batch: _Batch | None, fields: list[_Field], nbytes: int
    ) -> tuple[_Reserved | None, dict[str, set[int]], list[_Field]]:
        """This batch's reserved slab if every value staged in it is in this batch, in its slot; the
        positions already in place by key; the fields, at the plan's offsets when the slab is used.

        Counts the batch (``begin``) and learns the plan (and its ``nbytes``) from the first batch
        laid out in a slab. Values staged for a batch that came out otherwise (a subclass regrouped the samples) stop
        staging for good in this worker; a batch laid out otherwise makes the plan be learnt
        again. Either way the reserved slabs are retired (``_retire``)."""
        number = self._collated
        self._collated += 1
        reserved = self._reserved.pop(number, None)
        if batch is not None and self._plan is None and self._staging:
            self._plan, self._batch_size = tuple(fields), fields[0].shape[0] if fields else 0
            self._plan_bytes = nbytes
        if reserved is None:
            return None, {}, fields
        planned = self._planned(fields) if batch is not None else None
        placed = self._in_place(batch, planned, reserved) if batch is not None and planned is not None else {}
        if planned is None or sum(len(done) for done in placed.values()) != reserved.assigned:
            if planned is None:  # laid out otherwise (new windows, another dataset): learn it again
                self._plan = None
            else:  # values staged for a batch that came out otherwise: never again in this worker
                self._staging = False
            for other in [reserved, *self._reserved.values()]:
                self._retire(other)
            self._reserved.clear()
            return None, {}, fields
        return reserved, placed, planned

    def begin(self) -> None:
        """A new iteration of the dataset in this worker: its batches are counted from 0 again.

        Slabs reserved for batches never collated (an abandoned iteration) are retired, not reused:
        a decode of that iteration may still be writing into them."""
        with self._stage_lock:
            for reserved in self._reserved.values():
                self._retire(reserved)
            self._reserved.clear()
            self._collated = 0

    def destination(self, seq: int, key: str) -> torch.Tensor | None:
        """Where sample ``seq`` of this iteration (counted from 0) should put its value of ``key``:
        its slot in the slab its batch will travel in (reserved now, busy until that batch is
        collated), or ``None``: no plan yet, staging stopped, no free slab, or not a planned key."""
        with self._stage_lock:
            if self._plan is None or not self._staging or self._batch_size == 0 or _use_count is None:
                return None
            number, slot = divmod(seq, self._batch_size)
            field = next((f for f in self._plan if f.key == key), None)
            if number < self._collated or field is None:
                return None
            reserved = self._reserved.get(number)
            if reserved is None and number > self._collated:
                # a batch ahead leaves one slab spare (the one a batch staged nowhere, or the loop's
                # next hold, will need) besides one for each earlier batch staged nowhere
                unstaged = sum(b not in self._reserved for b in range(self._collated, number))
                if self._available() <= unstaged + 1:
                    return None
            if reserved is None:
                found = self._acquire(self._plan_bytes)
                if found is None:
                    return None
                reserved = self._reserved[number] = _Reserved(*found)
            reserved.assigned += 1
            reserved.keys.add(key)
            return _view(_bytes(reserved.slab.storage), field)[slot]

    def staged(self, seconds: float) -> None:
        """CPU time a decode thread spent writing a value into its slot (counted as collation).
        Its own lock: a decode thread never waits on the staging lock, which the worker's thread
        may hold while a collected stream waits for its decode threads."""
        with self._stat_lock:
            self._add("stage_cpu_s", seconds)

    def _planned(self, fields: list[_Field]) -> list[_Field] | None:
        """This batch's fields at the plan's offsets, or ``None`` if it is not laid out as the plan."""
        assert self._plan is not None
        if len(fields) != len(self._plan) or fields[0].shape[0] > self._batch_size:
            return None
        planned = []
        for f, p in zip(fields, self._plan):
            if (f.key, f.dtype, f.shape[1:], f.stride) != (p.key, p.dtype, p.shape[1:], p.stride):
                return None
            planned.append(dataclasses.replace(p, shape=f.shape))
        return planned

    @staticmethod
    def _in_place(batch: _Batch, fields: list[_Field], reserved: _Reserved) -> dict[str, set[int]]:
        """By key, the positions whose value already is its own slot of the reserved slab."""
        start = reserved.slab.storage.data_ptr()
        placed: dict[str, set[int]] = {}
        for f, (key, values, _) in zip(fields, batch.tensors):
            if key not in reserved.keys:
                continue
            step = f.stride[0] * _itemsize(f.dtype)
            done = {
                i
                for i, value in enumerate(values)
                if value.data_ptr() == start + f.offset + i * step and value.stride() == f.stride[1:]
            }
            if done:
                placed[key] = done
        return placed

    def _retire(self, reserved: _Reserved) -> None:
        """Never write this slab again (values staged in it may still be read, or written by a
        decode still running): a new one takes its place in the ring."""
        if self.slabs[reserved.index] is reserved.slab:
            self.slabs[reserved.index] = self._new(reserved.slab.nbytes, int(reserved.slab.header[1]))
        self._add("slabs_retired", 1)

    def _acquire(self, nbytes: int) -> tuple[int, _Slab] | None:
        """A free slab of at least ``nbytes``, marked busy; ``None`` when all are busy."""
        for i, slab in enumerate(self.slabs):
            if int(slab.header[0]) != FREE:
                continue
            if slab.nbytes < nbytes:  # larger batches than before: replace it (the main process notices)
                slab = self.slabs[i] = self._new(nbytes, int(slab.header[1]))
            elif _viewed_here(slab):  # a sample staged in it is still kept in this worker: never rewrite it
                slab = self.slabs[i] = self._new(slab.nbytes, int(slab.header[1]))
                self._add("slabs_retired", 1)
                self._staging = False  # whatever keeps samples would keep a slab per batch alive
            slab.header[0] = BUSY
            return i, slab
        if len(self.slabs) < self.capacity:
            slab = self._new(nbytes, 0)
            self.slabs.append(slab)
            slab.header[0] = BUSY
            return len(self.slabs) - 1, slab
        return None

    def _available(self) -> int:
        """Slabs free now or still to be made."""
        return sum(int(slab.header[0]) == FREE for slab in self.slabs) + self.capacity - len(self.slabs)

    def _new(self, nbytes: int, generation: int) -> _Slab:
        size = HEADER_BYTES + nbytes
        storage = torch.UntypedStorage(size) if self.local else torch.UntypedStorage._new_shared(size)
        header = _header(storage)
        header[0], header[1] = FREE, generation
        self._add("slabs_allocated", 1)
        self._add("slab_bytes", HEADER_BYTES + nbytes)
        return _Slab(storage, header, nbytes)


def _lend(
    slab: _Slab, generation: int, fields: list[_Field], others: dict[str, Any], order: tuple[str, ...]
) -> dict[str, Any]:
    """A main-process slab's batch (no workers), as views leased from it: the slab is freed when the
    last of them dies, as a worker's slab is (``_Lease``)."""
    base = torch.from_numpy(np.asarray(_LocalLease(slab, generation)))
    views = {f.key: _view(base, f) for f in fields}
    return {key: views[key] if key in views else others[key] for key in order}


def _interface(storage: torch.UntypedStorage) -> dict[str, Any]:
    """numpy's view of a whole slab as bytes, for a lease that owns a batch's memory."""
    return {"data": (storage.data_ptr(), False), "shape": (storage.nbytes(),), "typestr": "|u1", "version": 3}


class _LocalLease:
    """Owns a batch's view of a main-process slab; frees the slab (its header) when collected.

    It holds the ``_Slab``, not a tensor of it: the ring's ``_viewed_here`` counts the tensors that
    view the slab's storage, and a lent batch is not one of them (it views the lease's memory)."""

    def __init__(self, slab: _Slab, generation: int) -> None:
        self.slab, self.generation, self.pid = slab, generation, os.getpid()
        self.__array_interface__ = _interface(slab.storage)

    def __del__(self) -> None:
        if os.getpid() == self.pid and int(self.slab.header[1]) == self.generation:  # not a forked child's copy
            self.slab.header[0] = FREE


def _rebuild(*parts: Any) -> dict[str, Any]:
    """The batch, as views of the slab (runs where the ``SlabBatch`` is unpickled: the main process)."""
    return _registry().adopt(SlabBatch(*parts))


class _Mapped:
    """A slab as the main process keeps it mapped: our reference to its storage, and its lease."""

    def __init__(self, storage: torch.UntypedStorage, pid: int, pinned: bool) -> None:
        self.storage, self.pid, self.pinned = storage, pid, pinned
        self.leased = False

    def lease(self, generation: int, pending: collections.deque[tuple[_Mapped, int, Any]]) -> torch.Tensor:
        """The whole slab as one uint8 tensor whose memory is owned by a ``_Lease``: when the last
        tensor viewing it dies, the lease dies with it and frees the slab (``release``)."""
        self.leased = True
        lease = _Lease(self, generation, pending)
        return torch.from_numpy(np.asarray(lease))

    def release(self, generation: int) -> None:
        """The worker may write this slab again (runs in whichever thread dropped the last view)."""
        self.leased = False  # first: once FREE, the worker may write it and the pin thread adopt it
        header = _header(self.storage)
        if int(header[1]) == generation:
            header[0] = FREE


class _Lease:
    """Owns a batch's view of a slab (numpy's ``__array_interface__``); frees the slab when collected.

    A pinned slab is freed only once a CUDA event recorded at that moment has completed (queued in
    ``pending``, checked at the next batch), so that a ``non_blocking`` copy from it is done.
    """

    def __init__(self, entry: _Mapped, generation: int, pending: collections.deque[tuple[_Mapped, int, Any]]) -> None:
        self.entry, self.generation, self.pending = entry, generation, pending
        self.pid = os.getpid()
        self.__array_interface__ = _interface(entry.storage)

    def __del__(self) -> None:
        if os.getpid() != self.pid:
            # a forked child dropping its copy of a batch: the batch is still alive in the process
            # that leased it, and the slab (a shared mapping, inherited by the child) stays busy
            return
        if self.entry.pinned:
            event = torch.cuda.Event()
            event.record()
            self.pending.append((self.entry, self.generation, event))
        else:
            self.entry.release(self.generation)


class _Registry:
    """Every slab this process has seen, kept mapped (a slab is mapped once per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slabs: dict[tuple[int, int, int], _Mapped] = {}
        self._pending: collections.deque[tuple[_Mapped, int, Any]] = collections.deque()  # pinned, copies in flight
        self._counts = {"rebuilt": 0.0, "mapped": 0.0, "dropped": 0.0, "rebuild_cpu_s": 0.0}

    def adopt(self, wire: SlabBatch) -> dict[str, Any]:
        """Map (once) and lease the batch's slab and return the batch as views of it."""
        start = time.thread_time()
        storage, slab, generation = wire.storage, wire.slab, wire.generation
        with self._lock:
            while self._pending and self._pending[0][2].query():
                done, generation_done, _ = self._pending.popleft()
                done.release(generation_done)
            entry = self._slabs.get(slab)
            if entry is None or entry.storage.data_ptr() != storage.data_ptr():
                if entry is not None:  # the worker replaced this slab with a larger one
                    self._drop(slab)
                elif not any(key[:2] == slab[:2] for key in self._slabs):  # a new worker: forget exited ones
                    self._prune()
                entry = self._slabs[slab] = _Mapped(storage, slab[0], wire.pin and _pin(storage))
                self._counts["mapped"] += 1
            header = _header(entry.storage)
            state, written = int(header[0]), int(header[1])
            del header
            if state != BUSY or written != generation or entry.leased:  # only if the protocol is broken
                raise RuntimeError(
                    f"transport: slab {slab[2]} of worker pid {slab[0]} holds generation {written} (state {state}, "
                    f"leased {entry.leased}), expected {generation} (busy): it was written while in use"
                )
            base = entry.lease(generation, self._pending)
            batch: dict[str, Any] = {}
            views = {f.key: _view(base, f) for f in wire.fields}
            del base
            for key in wire.order:
                batch[key] = views[key] if key in views else wire.others[key]
            self._counts["rebuilt"] += 1
            self._counts["rebuild_cpu_s"] += time.thread_time() - start
        return batch

    def _prune(self) -> None:
        """Forget the slabs of workers that have exited and whose batches are gone."""
        for key, entry in list(self._slabs.items()):
            if not entry.leased and not _alive(entry.pid):
                self._drop(key)

    def _drop(self, key: tuple[int, int, int]) -> None:
        entry = self._slabs.pop(key)
        if entry.pinned and not entry.leased:
            torch.cuda.cudart().cudaHostUnregister(entry.storage.data_ptr())
        self._counts["dropped"] += 1

    def stats(self) -> dict[str, float]:
        with self._lock:
            leased = sum(e.leased for e in self._slabs.values())
            pinned = sum(e.pinned for e in self._slabs.values())
            return {
                **self._counts,
                "slabs_held": float(len(self._slabs)),
                "slabs_leased": float(leased),
                "slabs_pinned": float(pinned),
            }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pin(storage: torch.UntypedStorage) -> bool:
    """Page-lock a slab for CUDA copies (``cudaHostRegister``); ``False`` without CUDA or on failure."""
    if not torch.cuda.is_available():
        return False
    err = torch.cuda.cudart().cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0)
    return int(err) == 0


_WORKER_RING: tuple[int, _Ring] | None = None  # (pid, ring): this worker's SlabCollate, once it collated


def _set_worker_ring(ring: _Ring) -> None:
    global _WORKER_RING
    _WORKER_RING = (os.getpid(), ring)


def _worker_ring() -> _Ring | None:
    found = _WORKER_RING
    return found[1] if found is not None and found[0] == os.getpid() else None


class Staging:
    """A dataset's side of staging, for one iteration in a DataLoader worker: where its samples'
    decoded frames go so that the batch's collation has nothing left to copy.

    Only for a dataset the DataLoader batches directly (``get_worker_info().dataset`` itself, or,
    without workers, ``batched_directly``): a wrapper between them could regroup, keep or change
    samples. Sample ``seq`` (counted from 0 in
    this iteration, in the order the samples are yielded) lands in position ``seq % batch_size``
    of the worker's ``seq // batch_size``-th batch, as the DataLoader's fetcher groups an iterable
    dataset's samples. Once this worker's ``SlabCollate`` has collated one batch (its layout is the
    plan), ``destination`` reserves the slab of each coming batch, in order, and gives each image
    its slot there; the decode thread writes the frames into it, and collation finds them in place.
    Nothing depends on the prediction being right: a value not in its slot is copied as before,
    and values staged for a batch that came out otherwise stop staging in this worker (their slabs
    are retired, never written again). Only the newest staging of a process stages (a second
    stream begun beside it turns the first one off), and ``close`` ends it. Without a
    ``SlabCollate`` in this worker every ``destination`` is ``None``.

    A staged sample's frames are its batch's memory: a dataset subclass that keeps samples keeps
    their slab from being rewritten (``_viewed_here``), but a batch the loop changes in place
    changes the kept samples too.
    """

    def __init__(self) -> None:
        global _CURRENT_STAGING
        _CURRENT_STAGING = self
        ring = _worker_ring()
        # without workers the ring exists already (``batched_directly``) and is this iteration's
        # loader's: kept, since another no-workers loader's iteration may make its own current
        self._ring = ring if ring is not None and ring.local else None
        if ring is not None:
            ring.begin()

    def destination(self, seq: int, key: str) -> torch.Tensor | None:
        """The slot for sample ``seq``'s ``key`` (write exactly the value there), or ``None``."""
        ring = self._ring or _worker_ring()  # a worker's is made at its first collate, in its first iteration
        if ring is None or _CURRENT_STAGING is not self:
            return None
        return ring.destination(seq, key)

    def staged(self, seconds: float) -> None:
        """Count the CPU time spent writing a value into its slot (as collation)."""
        ring = self._ring or _worker_ring()
        if ring is not None:
            ring.staged(seconds)

    def close(self) -> None:
        """This iteration is over: it stages nothing more."""
        global _CURRENT_STAGING
        if _CURRENT_STAGING is self:
            _CURRENT_STAGING = None


_CURRENT_STAGING: Staging | None = None  # the one staging of this process that may stage

# datasets a no-workers slab_loader batches itself, by id, with that loader's SlabCollate
_DIRECT: dict[int, tuple[weakref.ref[Any], weakref.ref[SlabCollate]]] = {}


def _batches_directly(dataset: object, collate: SlabCollate) -> None:
    """A no-workers DataLoader with ``collate`` batches ``dataset`` itself (``batched_directly``)."""
    if isinstance(dataset, IterableDataset):
        _DIRECT[id(dataset)] = (weakref.ref(dataset), weakref.ref(collate))


def batched_directly(dataset: object) -> bool:
    """Whether a no-workers ``slab_loader`` (or ``with_slabs``) batches ``dataset`` itself, as it yields its samples
    (its DataLoader's fetcher groups them in order): the main process's counterpart of
    ``get_worker_info().dataset is dataset``, which tells a worker's dataset that it may stage."""
    for key, (ref, _) in list(_DIRECT.items()):
        if ref() is None:
            del _DIRECT[key]
    found = _DIRECT.get(id(dataset))
    collate = None if found is None or found[0]() is not dataset else found[1]()
    if collate is None:
        return False
    # called as its iteration begins: its staging writes into its own loader's ring, not into the
    # ring of whichever no-workers SlabCollate of this process was made last (another loader's)
    _set_worker_ring(collate._ring_here(None))
    return True


_REGISTRY: tuple[int, _Registry] | None = None  # (pid, registry)
_REGISTRY_LOCK = threading.Lock()


def _registry() -> _Registry:
    """This process's registry (a forked child starts with none of its parent's slabs)."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None or _REGISTRY[0] != os.getpid():
            _REGISTRY = (os.getpid(), _Registry())
        return _REGISTRY[1]
