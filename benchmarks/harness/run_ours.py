"""One case of ours, or a limit, in its own process: ``run_ours.py CASE.json RESULT.json``.

- ``ours``: EpisodePoolDataset on the case's source through a DataLoader, timed by ``measure.drive``.
  With ``workers=0`` it decodes in ``decode_threads`` threads of the main process, one per CPU
  the process may use (unless the case's options say otherwise): the way to run without workers.
- ``ceiling``: samples shaped exactly like ours (same keys, dtypes, shapes; float images converted
  per sample as the loader does) made without I/O, through the same DataLoader: the most any
  DataLoader-based loader can deliver here.
- ``pure-decode``: the library's own ``DecoderCache`` decoding the frames of random samples of
  pool-resident episodes, in as many processes at once as the case has workers (workers=0: as
  many as its decode threads), at most one per CPU: the decode limit for that parallelism.
- ``ours`` with an ``epoch``: a whole epoch through the decoded-frame cache in the case's
  ``frame_cache_dir``, epoch 0 (``cold``: the cache empty) or epoch 1 (``warm``: the cache the
  cold epoch filled), from ``iter()`` to its last batch.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info  # noqa: E402

from harness.cases import camera_offsets, delta_timestamps  # noqa: E402
from harness.measure import drive, run_main  # noqa: E402

DTYPES = {"uint8": torch.uint8, "float32": torch.float32}


def main_process_threads() -> int:
    """Decode threads of a workers=0 case: the loader's automatic choice (one per CPU, at most 8)."""
    from lerobot_shards.loader.decoding.decoders import auto_decode_threads

    return auto_decode_threads("cpu")


def _dataset(spec: dict[str, Any], source: str | None = None, **overrides: Any) -> Any:
    from lerobot_shards.loader import EpisodePoolDataset

    case = spec["case"]
    source = source or case["source"]
    kwargs: dict[str, Any] = dict(
        delta_timestamps=delta_timestamps(case["mode"], spec["fps"], spec["cameras"]),
        episode_pool_size=case["pool_size"],
        seed=spec["seed"],
        image_dtype=DTYPES[case["image_dtype"]],
        video_decode_device=case["decode"],
    )
    if "bucket" in source:
        kwargs["storage_options"] = spec["storage_options"]
    if source == "converted-bucket-warm":
        kwargs["cache_dir"] = spec["cache_dir"]
    if source.startswith("raw"):  # the conversion's shard plan: same consumers, same samples
        kwargs.update(spec["raw_plan"])
    if case["resize"]:
        kwargs["resize"] = tuple(case["resize"])
    kwargs.update(case["loader_opts"], **overrides)
    paths = spec["paths"]
    url = paths.get(f"{source}@cuda", paths[source]) if case["decode"] != "cpu" else paths[source]
    return EpisodePoolDataset(url, **kwargs)


class TimedCollate:
    """torch's ``default_collate``, counting the CPU time it takes in each worker (``transport: queue``):
    the same counters as ``SlabCollate.stats()["workers"]``, so both transports split CPU alike."""

    def __init__(self) -> None:
        self._counters = multiprocessing.Array("d", 2, lock=False)  # samples, collate CPU seconds

    def __call__(self, samples: list[Any]) -> Any:
        start = time.thread_time()
        try:
            return default_collate(samples)
        finally:
            self._counters[0] += len(samples)
            self._counters[1] += time.thread_time() - start

    def stats(self) -> dict[str, Any]:
        return {"workers": {"samples": self._counters[0], "collate_cpu_s": self._counters[1]}}


def _loader(spec: dict[str, Any], dataset: Any) -> DataLoader:
    from lerobot_shards.loader.transport.slabs import SlabCollate, slab_loader

    case = spec["case"]
    extra: dict[str, Any] = {}
    if case["workers"]:
        extra["prefetch_factor"] = case["prefetch_factor"]
        slab = case.get("transport") == "slab"
        extra["collate_fn"] = SlabCollate(case["prefetch_factor"] + 2) if slab else TimedCollate()
        if case["decode"] != "cpu":
            extra["multiprocessing_context"] = "spawn"  # CUDA cannot start in forked workers
    elif case.get("transport") == "slab":  # the main process's own ring: slab_loader batches the dataset itself
        return slab_loader(dataset, batch_size=case["batch_size"], num_workers=0)
    elif case.get("epoch"):  # an epoch's CPU split needs collation timed in the main process too
        extra["collate_fn"] = TimedCollate()
    return DataLoader(dataset, batch_size=case["batch_size"], num_workers=case["workers"], **extra)


def cpu_split(result: dict[str, Any], loader: DataLoader, loader_stats: dict[str, Any] | None) -> dict[str, Any]:
    """CPU ms per sample split into decode (time in the decoder per sample emitted), collation (worker
    CPU in ``collate_fn`` per sample collated) and the rest (the transport to the main process, sampling,
    reads, the loop): ``cpu_ms_per_sample`` minus the other two. Decode (the decoding threads' CPU time,
    ``decode_cpu_seconds``) and collation are per sample over the whole run, the total over the measured
    span, so the rest is the least exact of the three."""
    total = result.get("cpu_ms_per_sample")
    stats = loader.collate_fn.stats() if hasattr(loader.collate_fn, "stats") else None
    if total is None or stats is None:
        return {}
    workers = stats["workers"]
    # collation: the collate_fn's CPU, and the slab transport's copies of frames into their slots
    # made by the decode threads as they decode (``transport.Staging``)
    copies = workers["collate_cpu_s"] + workers.get("stage_cpu_s", 0.0)
    collate = 1000 * copies / workers["samples"] if workers["samples"] else 0.0
    emitted = (loader_stats or {}).get("frames_emitted") or 0
    decode = 1000 * loader_stats["decode_cpu_seconds"] / emitted if loader_stats and emitted else 0.0
    # the frame cache's own counters (``loader.frame_fill``): its fills' sequential decoding counts
    # as decode, its verified reads as cache reads
    fill = 1000 * loader_stats.get("fill_cpu_seconds", 0.0) / emitted if loader_stats and emitted else 0.0
    read = 1000 * loader_stats.get("cache_read_cpu_seconds", 0.0) / emitted if loader_stats and emitted else 0.0
    # of the fills: the writes of decoded frames into new page-cache pages (``Fill.write_seconds``)
    write = 1000 * loader_stats.get("fill_write_cpu_seconds", 0.0) / emitted if loader_stats and emitted else 0.0
    out = {
        "decode_ms": round(decode + fill, 2),
        "fill_write_ms": round(write, 2),
        "cache_read_ms": round(read, 2),
        "collate_ms": round(collate, 2),
        "rest_ms": round(total - decode - fill - read - collate, 2),
    }
    if "slab_batches" in workers:
        out["transport"] = {k: v for k, v in workers.items() if k not in ("samples", "collate_cpu_s", "stage_cpu_s")}
        out["transport"]["main"] = stats["main"]
    return out


def _frames_per_sample(spec: dict[str, Any]) -> int:
    return len(camera_offsets(spec["case"]["mode"])) * len(spec["cameras"])


def _warmup_batches(spec: dict[str, Any]) -> int:
    """At least the batches that fill every consumer's episode pool (a pass admits one episode per
    ``FILL_EVERY`` samples): measured from there on, memory growth means a leak, not the pool filling."""
    from lerobot_shards.loader.plan.sampling import FILL_EVERY

    case = spec["case"]
    fill = case["pool_size"] * FILL_EVERY * max(1, case["workers"])
    return max(spec["warmup_batches"], -(-fill // case["batch_size"]))


def _drive(spec: dict[str, Any], loader: Any) -> dict[str, Any]:
    return drive(
        loader,
        warmup_batches=_warmup_batches(spec),
        batches=spec["batches"],
        frames_per_sample=_frames_per_sample(spec),
        batch_len=lambda b: len(b["index"]),
        max_seconds=spec.get("max_seconds"),
    )


def run_loader(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["case"]["decode"] != "cpu" and not torch.cuda.is_available():
        return {"status": "skipped", "note": "no CUDA device on this machine"}
    if spec["case"].get("epoch"):
        return run_epoch(spec)
    dataset = _dataset(spec)
    loader = _loader(spec, dataset)
    result = _drive(spec, loader)
    return _with_stats(result, dataset, loader)


def run_epoch(spec: dict[str, Any]) -> dict[str, Any]:
    """A whole epoch through the frame cache: epoch 0 into an empty cache (cold), or epoch 1 (warm;
    disk: the same once the cache's pages were dropped from memory).

    Without workers the main process collates with one torch thread, as each DataLoader worker does
    (torch sets one there): torch's intra-op threads spin while they wait, and on a loaded machine
    stacking a 480p uint8 batch of 16 then cost 63 ms of CPU against 1.5 ms on one thread."""
    if not spec["case"]["workers"]:
        torch.set_num_threads(1)
    dataset = _dataset(spec, frame_cache_dir=spec["frame_cache_dir"])
    dataset.set_epoch(0 if spec["case"]["epoch"] == "cold" else 1)
    loader = _loader(spec, dataset)
    result = drive(
        loader,
        warmup_batches=0,  # the epoch from iter() on: its first batch, its fills, all of it
        batches=1 << 40,
        frames_per_sample=_frames_per_sample(spec),
        batch_len=lambda b: len(b["index"]),
    )
    result["epoch_samples"] = dataset.epoch_samples(spec["case"]["workers"])
    result["torch_threads"] = torch.get_num_threads()
    return _with_stats(result, dataset, loader)


def _with_stats(result: dict[str, Any], dataset: Any, loader: DataLoader) -> dict[str, Any]:
    total = dataset.stats()["total"]
    lookups = total["decoder_hits"] + total["decoder_misses"]
    result["decoder_hit_rate"] = round(total["decoder_hits"] / lookups, 4) if lookups else None
    result["loader_stats"] = total
    result["decode_threads"] = int(total["decode_threads"])  # the default's choice, summed over consumers
    result["cpu_split_ms"] = cpu_split(result, loader, total)
    return result


class TemplateDataset(IterableDataset):
    """``num_samples`` copies of one real sample, made the way the loader makes them, without I/O."""

    def __init__(self, template: dict[str, Any], num_samples: int, float_images: bool) -> None:
        super().__init__()
        self.num_samples, self.float_images = num_samples, float_images
        self.template = {k: (v * 255).round().to(torch.uint8) if self._image(k, v) else v for k, v in template.items()}

    def _image(self, key: str, value: Any) -> bool:
        return self.float_images and isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 3

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for _ in range(worker, self.num_samples, workers):
            out = {}
            for k, v in self.template.items():
                if isinstance(v, torch.Tensor):
                    out[k] = (
                        v.float().div_(255)
                        if self.float_images and v.dtype == torch.uint8 and v.dim() >= 3
                        else v.clone()
                    )
                else:
                    out[k] = v
            yield out


def run_ceiling(spec: dict[str, Any]) -> dict[str, Any]:
    case = spec["case"]
    sample = next(iter(_dataset(spec)))
    n = (_warmup_batches(spec) + spec["batches"]) * case["batch_size"]
    dataset = TemplateDataset(sample, n, float_images=case["image_dtype"] == "float32")
    loader = _loader(spec, dataset)
    result = _drive(spec, loader)
    result["cpu_split_ms"] = cpu_split(result, loader, None)
    return result


def _decode_alone(spec: dict[str, Any], seed: int, go: Any, out: Any) -> None:
    """One decoder's share of the pure-decode limit: random samples of pool-resident episodes
    decoded by the library's ``DecoderCache``, timed from ``go`` (set when every share is ready);
    puts (samples, frames, wall s, CPU s of this process, decode s) on ``out``."""
    from lerobot_shards.loader.decoding.decoders import DecoderCache
    from lerobot_shards.loader.options import DecodeOptions
    from lerobot_shards.loader.read.sources import open_source

    case = spec["case"]
    source = open_source(spec["paths"]["converted-local"])
    rng = random.Random(seed)
    resident = []
    for shard in rng.sample(source.info.shards, len(source.info.shards)):
        resident += [source.read_episode(shard.index, e) for e in shard.episodes]
        if len(resident) >= case["pool_size"]:
            break
    resident = resident[: case["pool_size"]]
    cache = DecoderCache(len(resident) * len(spec["cameras"]), DecodeOptions(video_decode_device=case["decode"]))
    offsets = camera_offsets(case["mode"])
    n = (spec["warmup_batches"] + spec["batches"]) * case["batch_size"]
    max_seconds = spec.get("max_seconds")
    samples = frames = 0
    go.wait()
    cpu0, start = time.process_time(), time.perf_counter()
    while samples < n and not (max_seconds and time.perf_counter() - start >= max_seconds):
        ep = rng.choice(resident)
        f = rng.randrange(ep.length)
        for cam in spec["cameras"]:
            frames += len(cache.frames(ep.clips[cam], [min(max(f + o, 0), ep.length - 1) for o in offsets]))
        samples += 1
    out.put((samples, frames, time.perf_counter() - start, time.process_time() - cpu0, cache.decode_seconds))


def run_pure_decode(spec: dict[str, Any]) -> dict[str, Any]:
    """As many decoders as the case has workers (or decode threads at 0 workers, at most the CPUs),
    each in its own process and all at once: what decoding alone reaches with that parallelism on
    this machine, cores sharing caches and memory bandwidth as the loader's workers do."""
    case = spec["case"]
    cores = min(case["workers"] or main_process_threads(), os.cpu_count() or 1)
    context = multiprocessing.get_context("fork")
    go, out = context.Event(), context.Queue()
    shares = [context.Process(target=_decode_alone, args=(spec, spec["seed"] + i, go, out)) for i in range(cores)]
    for p in shares:
        p.start()
    go.set()
    results = [out.get() for _ in shares]
    for p in shares:
        p.join()
    samples = sum(r[0] for r in results)
    wall, cpu = max(r[2] for r in results), sum(r[3] for r in results)
    rate = sum(r[0] / r[2] for r in results)  # each share's own rate: none waits for the slowest
    return {
        "samples": samples,
        "wall_s": round(wall, 3),
        "time_capped": samples < cores * (spec["warmup_batches"] + spec["batches"]) * case["batch_size"],
        "cores": cores,
        "samples_per_s": round(rate, 2),  # the limit for this case's worker count
        "per_core_samples_per_s": round(rate / cores, 2),
        "frames_per_s": round(sum(r[1] / r[2] for r in results), 1),
        "cpu_ms_per_sample": round(cpu * 1000 / samples, 2),
        "decode_seconds": round(sum(r[4] for r in results), 3),
    }


RUNNERS = {"ours": run_loader, "ceiling": run_ceiling, "pure-decode": run_pure_decode}

if __name__ == "__main__":
    run_main(lambda spec: RUNNERS[spec["case"]["kind"]](spec))
