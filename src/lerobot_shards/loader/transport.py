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
- a worker whose slabs are all busy (the loop holds many batches) collates that batch the
  ordinary way (counted as ``fallback_batches``): the transport never blocks or deadlocks.

With ``pin_memory=True`` on a CUDA host, the main process page-locks each slab once
(``cudaHostRegister``) so that the DataLoader's ``pin_memory`` finds its tensors already pinned and
copies nothing; a pinned slab is marked free only after a CUDA event recorded at release time on
the current stream has completed, so a ``non_blocking`` copy from it on that stream has finished
(checked on an H200: ``benchmarks/gpu_check.py``'s ``slab`` section; README.md).
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
from collections.abc import Callable, Mapping
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
    nbytes = math.prod(f.shape) * torch.empty(0, dtype=f.dtype).element_size()
    return base[f.offset : f.offset + nbytes].view(f.dtype).as_strided(f.shape, f.stride)


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

    Samples must be mappings (as ``EpisodePoolDataset`` emits); others are collated by
    ``collate`` (counted as fallbacks). In the main process (``num_workers=0``) there is no
    transport: the batch is stacked there, in ``layout``. Use one ``SlabCollate`` per DataLoader.
    """

    def __init__(
        self,
        slabs: int = 4,
        *,
        pin_memory: bool = False,
        collate: Callable[[list[Any]], Any] = default_collate,
        layout: Layout = "sample",
    ) -> None:
        if isinstance(slabs, bool) or not isinstance(slabs, int) or slabs < 1:
            raise ValueError(f"slabs must be an int >= 1 (slabs per worker), got {slabs!r}")
        if layout not in ("sample", "contiguous"):
            raise ValueError(f"layout must be 'sample' or 'contiguous', got {layout!r}")
        self.slabs = slabs
        self.pin_memory = bool(pin_memory)
        self.collate = collate
        self.layout: Layout = layout
        self._counters = multiprocessing.Array("d", MAX_WORKERS * len(WORKER_FIELDS), lock=False)
        self._ring: _Ring | None = None  # this process's, made in the worker

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ring"] = None  # a spawned worker makes its own
        return state

    def __call__(self, samples: list[Any]) -> Any:
        info = get_worker_info()
        if info is None:  # the main process: nothing to transport, the batch is stacked here
            return _stack(samples, self.collate, self.layout)
        if self._ring is None or self._ring.pid != os.getpid():
            if not 0 <= info.id < MAX_WORKERS:
                raise ValueError(f"SlabCollate supports at most {MAX_WORKERS} DataLoader workers")
            self._ring = _Ring(self.slabs, self._counters, info.id)
        return self._ring.pack(samples, self.collate, self.pin_memory, self.layout)

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
    **kwargs: Any,
) -> DataLoader[Any]:
    """A stock ``DataLoader`` with ``SlabCollate`` as its ``collate_fn`` (``slabs`` default:
    ``prefetch_factor + 2``; ``layout`` as ``SlabCollate``'s); every other keyword goes to the
    DataLoader as is."""
    collate = SlabCollate(prefetch_factor + 2 if slabs is None else slabs, pin_memory=pin_memory, layout=layout)
    extra = dict(kwargs)
    if num_workers:
        extra["prefetch_factor"] = prefetch_factor
    return DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate, pin_memory=pin_memory, **extra
    )


def with_slabs(loader: DataLoader[Any], slabs: int | None = None, layout: Layout = "sample") -> DataLoader[Any]:
    """``loader`` itself, or, when it has workers and collates with torch's default (``collate_fn``
    unset or ``default_collate``), the same DataLoader with ``SlabCollate`` (``slabs`` default:
    ``prefetch_factor + 2``; ``layout`` as ``SlabCollate``'s) and every other setting kept. For a loader built by someone else (a
    trainer), before its first iterator; iterable datasets only (a map-style loader's sampler
    is not carried over).

    With ``pin_memory=True`` (LeRobot's trainer sets it on CUDA) the slabs are page-locked
    (``SlabCollate(pin_memory=True)``): the pin thread then finds every batch pinned and copies
    nothing, where it would otherwise copy each batch out of its slab.
    """
    if not loader.num_workers or loader.collate_fn is not default_collate:
        return loader
    if not isinstance(loader.dataset, IterableDataset):
        raise TypeError("with_slabs: only a DataLoader over an IterableDataset is rebuilt (its sampler is not carried)")
    prefetch = loader.prefetch_factor or 2
    extra: dict[str, Any] = {"in_order": loader.in_order} if hasattr(loader, "in_order") else {}  # torch >= 2.6
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        drop_last=loader.drop_last,
        num_workers=loader.num_workers,
        collate_fn=SlabCollate(prefetch + 2 if slabs is None else slabs, pin_memory=loader.pin_memory, layout=layout),
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
            if (
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


def _stack(samples: list[Any], collate: Callable[[list[Any]], Any], layout: Layout) -> Any:
    """The batch made in this process (no workers): as the slab path lays it out, in fresh memory
    (``default_collate`` here would keep a window's channels-last order even for ``"contiguous"``)."""
    batch = _Batch.plan(samples, collate, layout)
    if batch is None:
        return collate(samples)
    stacked = {
        key: torch.stack(
            values, out=torch.empty_strided((len(values), *values[0].shape), stride, dtype=values[0].dtype)
        )
        for key, values, stride in batch.tensors
    }
    return {key: stacked[key] if key in stacked else batch.others[key] for key in batch.order}


class _Ring:
    """One worker's slabs, allocated as needed up to ``capacity``."""

    def __init__(self, capacity: int, counters: Any, worker: int) -> None:
        self.capacity = capacity
        self.pid = os.getpid()
        self.token = secrets.randbits(62)  # tells this worker's slabs from a restarted worker's
        self.slabs: list[_Slab] = []
        self._counters = counters
        self._base = worker * len(WORKER_FIELDS)

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
        if batch is None:
            self._add("fallback_batches", 1)
            return collate(samples)
        fields, offset = [], HEADER_BYTES
        for key, values, stride in batch.tensors:
            fields.append(_Field(key, values[0].dtype, (len(values), *values[0].shape), stride, offset))
            offset += _align(values[0].element_size() * values[0].numel() * len(values))
        found = self._acquire(offset - HEADER_BYTES)
        if found is None:
            self._add("fallback_batches", 1)
            return collate(samples)
        index, slab = found
        generation = int(slab.header[1]) + 1
        slab.header[1] = generation
        for f, (_, values, _) in zip(fields, batch.tensors):
            torch.stack(values, out=_view(_bytes(slab.storage), f))
        self._add("slab_batches", 1)
        return SlabBatch(
            slab.storage, (self.pid, self.token, index), generation, tuple(fields), batch.others, batch.order, pin
        )

    def _acquire(self, nbytes: int) -> tuple[int, _Slab] | None:
        """A free slab of at least ``nbytes``, marked busy; ``None`` when all are busy."""
        for i, slab in enumerate(self.slabs):
            if int(slab.header[0]) != FREE:
                continue
            if slab.nbytes < nbytes:  # larger batches than before: replace it (the main process notices)
                slab = self.slabs[i] = self._new(nbytes, int(slab.header[1]))
            slab.header[0] = BUSY
            return i, slab
        if len(self.slabs) < self.capacity:
            slab = self._new(nbytes, 0)
            self.slabs.append(slab)
            slab.header[0] = BUSY
            return len(self.slabs) - 1, slab
        return None

    def _new(self, nbytes: int, generation: int) -> _Slab:
        storage = torch.UntypedStorage._new_shared(HEADER_BYTES + nbytes)
        header = _header(storage)
        header[0], header[1] = FREE, generation
        self._add("slabs_allocated", 1)
        self._add("slab_bytes", HEADER_BYTES + nbytes)
        return _Slab(storage, header, nbytes)


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
        nbytes = entry.storage.nbytes()
        self.__array_interface__ = {
            "data": (entry.storage.data_ptr(), False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

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


_REGISTRY: tuple[int, _Registry] | None = None  # (pid, registry)
_REGISTRY_LOCK = threading.Lock()


def _registry() -> _Registry:
    """This process's registry (a forked child starts with none of its parent's slabs)."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None or _REGISTRY[0] != os.getpid():
            _REGISTRY = (os.getpid(), _Registry())
        return _REGISTRY[1]
