"""``lerobot-shards train ARGS...``: LeRobot's own ``lerobot-train``, fed by ``EpisodePoolDataset``.

Everything but the data is LeRobot's: its argument parser and config, policy, processors,
optimizer, scheduler, Accelerate set-up, training loop, logging and checkpoints. This module
runs LeRobot's ``train()`` with four seams patched, nothing copied from its loop:

1. ``make_train_eval_datasets``: when ``--dataset.root`` (without it: the Hub repo ``--dataset.repo_id``)
   is a converted dataset or a raw LeRobot v3.0 dataset, local or a URL, the trainer gets an
   ``EpisodePoolDataset`` (a mixture file, ``.yaml``/``.yml``/``.json``: a ``MixtureDataset``) (uint8 frames, the policy's ``delta_timestamps`` resolved by LeRobot's
   own ``resolve_delta_timestamps``, ``meta`` with LeRobot's stats and ImageNet stats as LeRobot
   sets them). ``cfg.dataset.streaming`` is set so the trainer builds a plain DataLoader over an
   iterable dataset. Anything else goes to LeRobot's own factory.
2. ``accelerate.Accelerator.prepare``: our DataLoader is not wrapped. Accelerate would read an
   iterable dataset on rank 0 and dispatch its batches (or read every batch on every rank and
   slice); each rank's ``EpisodePoolDataset`` already reads its own disjoint share.
3. The DataLoader is iterated through ``PositionedLoader``, which calls ``set_epoch`` per pass,
   counts the batches the loop took, and creates each pass's iterator under a forked torch RNG.
   With worker processes it is first rebuilt with ``SlabCollate`` (``transport.with_slabs``): the
   workers hand batches over in reused shared memory, not a fresh segment per key and batch.
4. ``save_checkpoint`` also writes ``training_state/lerobot_shards_data.json``
   (``{epoch, batches_consumed, batch_size, ...}``); ``--resume=true`` loads it into the dataset.

Why 3's forked RNG: creating a DataLoader iterator draws its base seed from torch's global RNG.
LeRobot restores the RNG state saved at the checkpoint and then creates its iterator, so a
resumed run's first step sees the RNG one draw later than the uninterrupted run did at that
step (dropout masks, ACT's latent sample differ: the loss differs from the first resumed step).
Forking leaves the global RNG untouched in both runs, so a resume continues bit-identically.

Our own settings beyond ``lerobot-train``'s arguments are ``--shards.NAME=VALUE`` arguments
(``train_settings``: storage options, cache directory, pool size, equal counts, slab layout, sample
log, decoded-frame cache, partition), each defaulting to ``LEROBOT_SHARDS_<NAME>``; the data state
records them and a resume restores them. The decoded-frame cache is on by itself where the node's
local disk has room for the frames, and the partition node-sticky (``frame_cache_choice``):
``--shards.frame_cache=off`` turns the cache off. ``--shards.sample_log=DIR`` appends each batch's ``index`` values to
``DIR/rank<R>.txt`` (which frames each rank trained on).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..cpus import cores_per_rank
from ..exceptions import LeRobotShardsError
from ..language import LANGUAGE_COLUMNS
from ..loader import EpisodePoolDataset, MixtureDataset
from ..loader.base import ResumableDataset
from ..loader.decoding.decoders import MAX_AUTO_DECODE_THREADS
from ..loader.mix.dataset import open_dataset
from ..loader.mix.spec import is_mixture_file
from ..loader.transport.slabs import with_slabs
from ..redaction import without_credentials
from ..storage import StorageLocation
from . import train_process
from .eval_split import eval_subset, split_episodes
from .frame_cache_choice import choose_frame_cache, choose_partition
from .train_settings import SETTINGS_KEY, TrainSettings, read_data_state, resolve, split_args, usage

log = logging.getLogger(__name__)

SUPPORTED = ("0.6",)  # LeRobot minor versions this integration is tested with
INSTALL_HINT = 'pip install "lerobot[training]==0.6.1"  (needs Python >= 3.12)'
DATA_STATE_NAME = "lerobot_shards_data.json"  # in a checkpoint's training_state/


class LeRobotUnavailable(LeRobotShardsError, RuntimeError):
    """LeRobot is missing or of a version this integration does not support (one line)."""


def check_lerobot() -> str:
    """The installed LeRobot version, or ``LeRobotUnavailable`` saying what is supported and how to install it."""
    try:
        version = importlib.metadata.version("lerobot")
    except importlib.metadata.PackageNotFoundError:
        raise LeRobotUnavailable(
            f"lerobot-shards train runs LeRobot's trainer, and LeRobot is not installed; supported: "
            f"LeRobot {', '.join(v + '.x' for v in SUPPORTED)}; install: {INSTALL_HINT}"
        ) from None
    if ".".join(version.split(".")[:2]) not in SUPPORTED:
        raise LeRobotUnavailable(
            f"lerobot-shards train supports LeRobot {', '.join(v + '.x' for v in SUPPORTED)}, found {version}; "
            f"install: {INSTALL_HINT}"
        )
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise LeRobotUnavailable(
            f"LeRobot {version} is installed without its training extra (accelerate); install: {INSTALL_HINT}"
        ) from None
    return version


def choose_layout(cpus: int, ranks_per_node: int) -> tuple[int, int]:
    """``(num_workers, decode_threads)`` per rank for ``cpus`` usable cores shared by ``ranks_per_node`` ranks.

    Up to 4 cores per rank: no worker processes and one decode thread per core in the training
    process (the fastest layout measured on 2 cores: frames never cross processes). More: half as
    many workers as cores (at most 8), each decoding a sample's cameras on the cores left to it
    (at most 8 threads): on 16 cores 8 workers x 2 threads read 609-724 samples/s, 14 x 1 618,
    4 x 4 573, the training process's own 8-14 threads 237-307 (docs/transport.md, Recommended layout).
    """
    per_rank = max(1, cpus // max(1, ranks_per_node))
    if per_rank <= 4:
        return 0, per_rank
    workers = min(per_rank // 2, 8)
    return workers, min(per_rank // workers, MAX_AUTO_DECODE_THREADS)


def _given(argv: Sequence[str], name: str) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv)


def _is_our_source(url: str, storage_options: dict[str, Any] | None) -> bool:
    """A converted dataset (manifest.json), a raw LeRobot v3.0 dataset (meta/info.json) or a mixture file at ``url``."""
    import posixpath

    if is_mixture_file(url):
        return True

    from ..filesystems import url_to_fs

    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
        path = path.rstrip("/")
        if fs.exists(posixpath.join(path, "manifest.json")) or fs.exists(posixpath.join(path, "meta/info.json")):
            return True
        if fs.exists(posixpath.join(path, "convert.json")):  # else LeRobot's "meta/info.json: no such file"
            raise ValueError(
                f"lerobot-shards train: {url} holds an unfinished conversion (convert.json, no manifest.json): "
                "re-run the conversion to finish it, or `lerobot-shards convert ... --finalize` after array tasks"
            )
        parent = posixpath.dirname(path)
        if posixpath.basename(path) == "shards" and fs.exists(posixpath.join(parent, "manifest.json")):
            raise ValueError(
                f"lerobot-shards train: {url} is a conversion's shards/ folder: give the conversion itself, {parent}"
            )
        return False
    except (FileNotFoundError, NotADirectoryError):
        return False


def opened_line(url: str, dataset: Any, layout: str) -> str:
    """What train prints of the dataset it opened: the URL without a ``user:password@`` (a run's
    log is kept and shared; the URL is used with them)."""
    return (
        f"lerobot-shards train: {without_credentials(url)}: {dataset.num_episodes} episodes, "
        f"{dataset.num_frames} frames, rank {dataset.rank}/{dataset.world_size}; {layout}"
    )


def dataset_url(cfg: Any) -> str:
    """``--dataset.root``, else the Hub dataset repo ``--dataset.repo_id`` at ``--dataset.revision``
    (None: the codebase-version tag, as LeRobot picks it) as ``hf://datasets/<repo_id>@<commit>``,
    streamed by our loader (``integrations.hub``), not downloaded into LeRobot's cache first. With
    ``--dataset.repo_type=bucket``: the storage bucket LeRobot's streaming dataset reads,
    ``hf://buckets/<repo_id>`` (a bucket has no revisions: LeRobot ignores ``--dataset.revision``)."""
    if cfg.dataset.root:
        return str(cfg.dataset.root)
    if getattr(cfg.dataset, "repo_type", "dataset") == "bucket":
        return f"hf://buckets/{cfg.dataset.repo_id}"
    from .hub import repo_url

    return repo_url(cfg.dataset.repo_id, getattr(cfg.dataset, "revision", None))


class LeRobotMeta:
    """``EpisodePoolDataset.meta`` as LeRobot's code reads it: its ``repo_id``, ``tasks`` as the pandas
    frame LeRobot keeps (task string index, ``task_index`` column), stats it may edit in place."""

    def __init__(self, meta: Any, repo_id: str) -> None:
        import pandas as pd

        self._meta = meta
        self.repo_id = repo_id
        self.stats = {k: dict(v) for k, v in meta.stats.items()}
        self.tasks = pd.DataFrame({"task_index": range(len(meta.tasks))}, index=pd.Index(meta.tasks, name="task"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # unpickling (spawned DataLoader workers) asks before _meta is set
            raise AttributeError(name)
        return getattr(self._meta, name)


class PositionedLoader:
    """Our DataLoader as the trainer iterates it: ``set_epoch`` per pass, the batches taken counted.

    LeRobot's loop cycles the loader (a new iterator per pass) and takes one batch per step, so
    the position after step N is exact: ``{epoch, batches_consumed}`` of the pass in progress.
    """

    def __init__(self, loader: DataLoader, epoch: int = 0, batches: int = 0, sample_log: str | None = None) -> None:
        self.loader = loader
        assert isinstance(loader.dataset, ResumableDataset)
        self.dataset = loader.dataset
        self.epoch, self.batches = epoch, batches
        self.sample_log = sample_log

    def __iter__(self) -> Iterator[Any]:
        self.dataset.set_epoch(self.epoch)
        with torch.random.fork_rng(devices=[]):  # the iterator's base seed must not move the training RNG
            batches = iter(self.loader)
        log_dir = self.sample_log
        for batch in batches:
            self.batches += 1
            if log_dir:  # an audit trail: which frames this rank trained on, batch by batch
                with open(Path(log_dir) / f"rank{self.dataset.rank}.txt", "a") as f:
                    f.write(f"{self.epoch} {self.batches} {' '.join(_logged(batch))}\n")
            yield batch
        self.epoch, self.batches = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return self.dataset.state_dict(batches_consumed=self.batches, batch_size=int(self.loader.batch_size or 1))


def _logged(batch: Mapping[str, Any]) -> list[str]:
    """The samples of a batch as the audit log names them: ``index``, or ``dataset_index:index`` for
    a mixture (its sources' indices repeat)."""
    index = map(str, batch["index"].tolist())
    if "dataset_index" not in batch:
        return list(index)
    return [f"{d}:{i}" for d, i in zip(batch["dataset_index"].tolist(), index)]


class _Run:
    """What the patched seams share within one ``train()`` call."""

    loader: PositionedLoader | None = None
    resume: dict[str, Any] | None = None
    settings: TrainSettings = TrainSettings()
    eval_dataset: EpisodePoolDataset | TaskSubset | None = None  # the held-out episodes (--dataset.eval_split)
    layout: str = ""
    frame_cache: str = ""  # what the decoded-frame cache and the partition are, and why
    cfg: Any = None  # the trainer's config, and its dataset.streaming as the user gave it
    streaming: bool = False


def _equal_samples_per_rank(given: bool | None, state: Mapping[str, Any] | None, world_size: int) -> bool | None:
    """``--shards.equal_samples_per_rank`` when set (``given``), else what a resumed checkpoint
    needs, else None (the loader's default: on with several ranks).

    A checkpoint saved with equal counts per rank keeps them on any number of processes (its
    epoch then finishes elastically). One saved without them (a single process) resumes so on one
    process only: on several, ranks would run different batch counts every epoch and drift
    apart, while a checkpoint holds one position for all of them; that resume is refused."""
    if given is not None:
        return given
    saved = (state or {}).get("equal_samples_per_rank")
    if saved is True or (saved is False and world_size == 1):
        return saved
    if saved is False:
        raise ValueError(
            f"lerobot-shards train: this checkpoint was saved by one process, whose ranks need no equal "
            f"batch counts (equal_samples_per_rank=False); resumed on {world_size} processes they would "
            f"drift apart: resume it on one process, or start a new run on {world_size}"
        )
    return None


def _drop_n_last_frames(cfg: Any, state: Mapping[str, Any] | None) -> int:
    """The frames at each episode's end LeRobot's ``EpisodeAwareSampler`` never samples for this
    policy (``drop_n_last_frames``: Diffusion's 7), or a resumed checkpoint's own value: its epoch
    goes on in the order it started (a checkpoint from before the option dropped none)."""
    wanted = int(getattr(cfg.trainable_config, "drop_n_last_frames", 0) or 0)
    if state is None or "order_digest" not in state:
        return wanted
    saved = int(state.get("drop_n_last_frames", 0))
    if saved != wanted:
        log.warning(
            "lerobot-shards train: the checkpoint's data order leaves the last %d frames of each episode "
            "unsampled, the policy asks for %d: the checkpoint's value is kept",
            saved,
            wanted,
        )
    return saved


def _world_size() -> int:
    """The number of training processes, as the loader will find it (torch.distributed, else WORLD_SIZE)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    text = os.environ.get("WORLD_SIZE", "1").strip() or "1"
    return int(text) if text.isdigit() else 1


def decode_ahead(num_workers: int, batch_size: int) -> int | None:
    """The samples decoded ahead (the loader's ``decode_ahead``): without DataLoader workers, a batch.

    Then the policy's step runs in the thread that iterates the dataset, and the decode threads
    decode and augment (``augmented_when_decoded``) only the samples queued ahead of it: with the
    default (2 x decode threads, 4 on 2 cores) they idled through most of a step, the step and the
    loading took turns (1.3 of 2 cores busy). With a batch queued, the next batch is prepared
    while the step runs. The data position is untouched: it counts the batches the loop took,
    never the samples decoded ahead. With workers, their prefetched batches overlap already."""
    return max(batch_size, 1) if num_workers == 0 else None


def _fit_layout(cfg: Any, dataset: ResumableDataset, cores: int, ahead: int | None = None) -> str:
    """The chosen worker count, lowered when the ranks' workers outnumber the episodes (each
    worker reads episodes of its own: with fewer, the loader refuses); a line saying so."""
    sources = getattr(dataset, "sources", None) or [dataset]
    fit = min(s.num_episodes for s in sources) // dataset.world_size
    note = ""
    if cfg.num_workers > fit:
        chosen, cfg.num_workers = cfg.num_workers, (fit if fit >= 2 else 0)
        note = f", fewer than the {chosen} for its cores: {fit} episodes per rank"
    threads = min(cores // cfg.num_workers if cfg.num_workers else cores, MAX_AUTO_DECODE_THREADS)
    return (
        f"num_workers={cfg.num_workers}, decode_threads={max(threads, 0)}{_ahead(ahead)} (chosen for this "
        f"rank's {cores} cores{note}; --num_workers N overrides)"
    )


def _ahead(ahead: int | None) -> str:
    return "" if ahead is None else f", decode_ahead={ahead} (a batch, prepared during each step)"


def _eval_split(url: str, cfg: Any, common: Mapping[str, Any]) -> tuple[EpisodePoolDataset, list[int], list[int]]:
    """The dataset before the split (``--dataset.episodes``, or all) and its training and held-out
    episodes, as LeRobot's ``make_train_eval_datasets`` splits them (``eval_split``)."""
    if is_mixture_file(url):
        raise ValueError(
            "lerobot-shards train: --dataset.eval_split does not apply to a mixture file (hold episodes out "
            "with each source's episodes in the file)"
        )
    if cfg.max_eval_samples > 0 and _world_size() > 1:
        raise ValueError(
            "lerobot-shards train: --max_eval_samples takes one subset of the held-out frames, which LeRobot's "
            "processes share batch by batch, where ours evaluate episodes of their own: evaluate every held-out "
            "frame (leave it at 0) or run one process"
        )
    whole = EpisodePoolDataset(
        url,
        episodes=cfg.dataset.episodes,
        storage_options=common["storage_options"],
        cache_dir=common["cache_dir"],
        data_files_root=common.get("data_files_root"),
    )
    tasks = whole.episode_tasks()
    train, held = split_episodes(list(cfg.dataset.episodes or sorted(tasks)), tasks, cfg.dataset.eval_split)
    groups = len({t[0] if t else "" for t in tasks.values()})
    print(
        f"lerobot-shards train: train/eval split: {len(train)} train, {len(held)} eval episodes "
        f"(eval_split={cfg.dataset.eval_split}, {groups} tasks)",
        file=sys.stderr,
        flush=True,
    )
    return whole, train, held


def _frame_cache(
    dataset: EpisodePoolDataset | MixtureDataset,
    setting: str,
    partition: str,
    held_out: Sequence[EpisodePoolDataset] = (),
) -> str:
    """Turn the decoded-frame cache on where ``frame_cache_choice`` finds room for this node's frames
    (its part under the node-sticky partition, else all of them), and the held-out episodes'
    (``--dataset.eval_split``: the datasets evaluating them, each a subset of the first, whose frames
    are all counted: every rank may evaluate any of them), evaluated again at every ``--eval_freq``
    steps; the line saying what it chose."""
    nodes = dataset.epoch_order.nodes if isinstance(dataset, EpisodePoolDataset) else 1
    held = max((d.decoded_bytes for d in held_out), default=0)
    choice = choose_frame_cache(setting, -(-dataset.decoded_bytes // nodes) + held)
    if choice.directory is not None:
        for each in (dataset, *held_out):
            each.set_frame_cache(choice.directory, choice.max_bytes)
    also = f", with the {held_out[0].num_episodes} held-out episodes" if held_out else ""
    return f"{choice.line()}; {partition}, {nodes} node{'s' if nodes > 1 else ''}{also}"


def _held_out(
    url: str, cfg: Any, held: list[int], whole: EpisodePoolDataset, settings: TrainSettings, common: Mapping[str, Any]
) -> tuple[EpisodePoolDataset, list[tuple[int, EpisodePoolDataset]], int]:
    """The held-out episodes' dataset (read in index order, every frame once, as LeRobot's eval
    loader), and with ``--max_eval_samples`` each task's and the frames taken of each
    (``eval_subset``); their windows not set yet."""
    kwargs: dict[str, Any] = dict(
        shuffle=False,
        equal_samples_per_rank=False,
        image_dtype=torch.uint8,
        tolerance_s=cfg.tolerance_s,
        depth_output_unit=cfg.dataset.depth_output_unit,
        episode_pool_size=settings.episode_pool_size,
        storage_options=common["storage_options"],
        cache_dir=settings.cache_dir,
        frame_cache_pixels=settings.frame_cache_pixels,
        data_files_root=common.get("data_files_root"),
    )
    held_out = EpisodePoolDataset(url, episodes=held, **kwargs)
    if len(held) < held_out.world_size:
        raise ValueError(
            f"lerobot-shards train: --dataset.eval_split={cfg.dataset.eval_split} holds out {len(held)} "
            f"episodes, fewer than the {held_out.world_size} processes (each evaluates episodes of its own)"
        )
    if cfg.max_eval_samples <= 0:
        return held_out, [], 0
    tasks = whole.episode_tasks()
    per_task, plan = eval_subset(held, tasks, {t: i for i, t in enumerate(whole.meta.tasks)}, cfg.max_eval_samples)
    parts = [(task_index, EpisodePoolDataset(url, episodes=episodes, **kwargs)) for task_index, episodes in plan]
    return held_out, parts, per_task


def _make_datasets(original: Any, run: type[_Run], argv: Sequence[str], given: Mapping[str, str]) -> Any:
    def make_train_eval_datasets(cfg: Any) -> Any:
        url = dataset_url(cfg)
        state_path = str(Path(cfg.checkpoint_path) / "training_state" / DATA_STATE_NAME) if cfg.resume else ""
        state, recorded = read_data_state(state_path) if cfg.resume else (None, None)
        settings = run.settings = resolve(given, recorded, recorded_in=state_path)
        options = settings.storage_options
        if not _is_our_source(url, options):
            log.info(
                "lerobot-shards train: %s is neither converted nor a v3.0 dataset; LeRobot's dataset reads it",
                without_credentials(url),
            )
            return original(cfg)
        from lerobot.datasets.factory import resolve_delta_timestamps
        from lerobot.utils.constants import IMAGENET_STATS

        cores = cores_per_rank()  # this rank's share of the node's cores: ranks on one node share them
        chosen = not (_given(argv, "num_workers") or cfg.resume)  # a resume keeps the saved run's workers
        decode_threads: int | None = None  # chosen: the loader's own, by the workers it runs under
        if chosen:
            cfg.num_workers, _ = choose_layout(cores, 1)
        else:
            decode_threads = min(cores // cfg.num_workers if cfg.num_workers else cores, MAX_AUTO_DECODE_THREADS)
        # The trainer then builds a plain DataLoader (no sampler) over our iterable; the user's value
        # is put back once it is built, so the checkpoints' train_config.json says what was asked.
        run.cfg, run.streaming = cfg, cfg.dataset.streaming
        cfg.dataset.streaming = True
        common: dict[str, Any] = dict(
            storage_options=options, cache_dir=settings.cache_dir, frame_cache_pixels=settings.frame_cache_pixels
        )
        if settings.data_files_root is not None:  # one location, its own options, for every dataset below
            common["data_files_root"] = StorageLocation(settings.data_files_root, settings.data_files_storage_options)
        if is_mixture_file(url):
            if cfg.dataset.episodes:
                raise ValueError(
                    "lerobot-shards train: --dataset.episodes does not apply to a mixture file (give "
                    "each source's episodes in the file)"
                )
        else:
            common["episodes"] = cfg.dataset.episodes
        equal = _equal_samples_per_rank(settings.equal_samples_per_rank, state, _world_size())
        if equal is not None:
            common["equal_samples_per_rank"] = equal
        whole = None  # with an eval split: the dataset before it, whose stats the policy normalizes with
        if cfg.dataset.eval_split:
            whole, common["episodes"], held = _eval_split(url, cfg, common)
        common["drop_n_last_frames"] = _drop_n_last_frames(cfg, state)
        # depth maps in LeRobot's --dataset.depth_output_unit (its make_dataset's; its eval split's
        # datasets leave it at mm, ours keep the one asked for)
        common["depth_output_unit"] = cfg.dataset.depth_output_unit
        if cfg.dataset.image_transforms.enable:  # LeRobot's own, seeded per sample by the loader
            from lerobot.transforms import ImageTransforms

            from .image_kernels import ExactKernels  # torchvision's costliest kernels, same bits

            transforms = ImageTransforms(cfg.dataset.image_transforms)
            common["image_transforms"] = ExactKernels(transforms)
            print(
                f"lerobot-shards train: LeRobot's ImageTransforms ({', '.join(transforms.transforms)}; at most "
                f"{cfg.dataset.image_transforms.max_num_transforms} per sample), seeded per sample",
                file=sys.stderr,
                flush=True,
            )
        common["partition"], partition_why = choose_partition(settings.partition, is_mixture_file(url), state)
        ahead = decode_ahead(cfg.num_workers, cfg.batch_size)
        dataset = open_dataset(
            url,
            seed=cfg.seed if cfg.seed is not None else 0,
            image_dtype=torch.uint8,
            tolerance_s=cfg.tolerance_s,
            decode_threads=decode_threads,
            decode_ahead=ahead,
            episode_pool_size=settings.episode_pool_size,
            **common,
        )
        if chosen:
            run.layout = _fit_layout(cfg, dataset, cores, ahead)
        else:
            why = "given" if _given(argv, "num_workers") else "the checkpoint's"
            run.layout = (
                f"num_workers={cfg.num_workers} ({why}), decode_threads={decode_threads}{_ahead(ahead)} "
                f"(for this rank's {cores} cores)"
            )
        held_out, parts, per_task = (
            _held_out(url, cfg, held, whole, settings, common) if whole is not None else (None, [], 0)
        )
        run.frame_cache = _frame_cache(
            dataset,
            settings.frame_cache,
            f"partition={common['partition']} ({partition_why})",
            [d for d in (held_out, *(part for _, part in parts)) if d is not None],
        )
        # the policy's windows need the dataset's metadata: opened once, its windows set after
        deltas = resolve_delta_timestamps(cfg.trainable_config, dataset.meta)
        dataset.set_delta_timestamps(deltas, cfg.tolerance_s)
        meta = LeRobotMeta((whole or dataset).meta, cfg.dataset.repo_id)
        if cfg.dataset.use_imagenet_stats:  # as LeRobot's make_dataset does
            for key in meta.camera_keys:
                if key in meta.depth_keys:
                    continue
                for name, value in IMAGENET_STATS.items():
                    meta.stats.setdefault(key, {})[name] = torch.tensor(value, dtype=torch.float32)
        dataset.__dict__["meta"] = meta  # what the trainer, make_policy and the processors read
        if state_path is not None:
            if state is not None:
                run.resume = state
                dataset.load_state_dict(state)
            else:
                log.warning(
                    "lerobot-shards train: %s not found: the data order restarts at epoch 0 (checkpoint not written "
                    "by lerobot-shards train)",
                    state_path,
                )
        print(opened_line(url, dataset, run.layout), file=sys.stderr, flush=True)
        print(run.frame_cache, file=sys.stderr, flush=True)
        if held_out is None:
            return dataset, None
        held_out.set_delta_timestamps(deltas, cfg.tolerance_s)
        held_out.__dict__["meta"] = meta
        evaluated: EpisodePoolDataset | TaskSubset = held_out
        if parts:
            for _, part in parts:
                part.set_delta_timestamps(deltas, cfg.tolerance_s)
            evaluated = TaskSubset(parts, per_task, meta)
            print(
                f"lerobot-shards train: --max_eval_samples={cfg.max_eval_samples}: the first {per_task} held-out "
                f"frames of each of {len(parts)} tasks, task after task (LeRobot's subset)",
                file=sys.stderr,
                flush=True,
            )
        run.eval_dataset = evaluated
        return dataset, evaluated

    return make_train_eval_datasets


def _accelerator_class(base: type, run: type[_Run]) -> type:
    class ShardsAccelerator(base):
        """Accelerate's Accelerator that leaves our DataLoader to us (each rank reads its own share)."""

        def prepare(self, *args: Any, device_placement: Any = None) -> Any:
            ours = [
                isinstance(a, DataLoader)
                and (isinstance(a.dataset, ResumableDataset) or (a.dataset is run.eval_dataset is not None))
                for a in args
            ]
            rest = [a for a, mine in zip(args, ours) if not mine]
            prepared: Any = super().prepare(*rest, device_placement=device_placement) if rest else ()
            if len(rest) == 1:
                prepared = (prepared,)
            others = iter(prepared)
            out: list[Any] = []
            for arg, mine in zip(args, ours):
                if mine and arg.dataset is run.eval_dataset:
                    out.append(_eval_loader(arg))
                elif mine:
                    if run.cfg is not None:  # built: the config LeRobot saves says what the user asked
                        run.cfg.dataset.streaming = run.streaming
                    state = run.resume or {}
                    loader = with_slabs(arg, layout=run.settings.slab_layout, drop=_collate_drops(arg))
                    if loader is not arg:
                        how = (
                            f"{loader.num_workers} workers hand batches over in reused shared-memory slabs"
                            if loader.num_workers
                            else "batches are reused slabs that the decode threads read frames into"
                        )
                        print(f"lerobot-shards train: {how} (SlabCollate)", file=sys.stderr, flush=True)
                    run.loader = PositionedLoader(
                        loader,
                        int(state.get("epoch", 0)),
                        int(state.get("batches_consumed", 0)),
                        sample_log=run.settings.sample_log,
                    )
                    out.append(run.loader)
                else:
                    out.append(next(others))
            return tuple(out) if len(out) > 1 else out[0]

    return ShardsAccelerator


class TaskSubset(IterableDataset):
    """``--max_eval_samples``: the held-out frames LeRobot's ``Subset`` evaluates, task after task (by
    ``task_index``), the first ``per_task`` frames of each in index order; each task's read by a
    dataset of the held-out episodes holding it (``parts``), its other tasks' frames passed over."""

    def __init__(self, parts: Sequence[tuple[int, EpisodePoolDataset]], per_task: int, meta: Any) -> None:
        self.parts, self.per_task, self.meta = list(parts), per_task, meta

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for task_index, part in self.parts:
            taken = 0
            samples = iter(part)
            try:
                for sample in samples:
                    if int(sample["task_index"]) == task_index:
                        yield sample
                        taken += 1
                        if taken == self.per_task:
                            break
            finally:
                close = getattr(samples, "close", None)
                if close is not None:
                    close()


def _collate_drops(loader: DataLoader) -> tuple[str, ...] | None:
    """The keys LeRobot's ``lerobot_collate_fn`` leaves out of a batch when LeRobot's trainer chose it
    (a dataset with language columns): on our samples (no ``None``, no rendered messages) it is
    ``default_collate`` without its language columns, which ``SlabCollate(drop=...)`` gives."""
    from lerobot.utils.collate import lerobot_collate_fn

    return LANGUAGE_COLUMNS if loader.collate_fn is lerobot_collate_fn else None


def _eval_loader(loader: DataLoader) -> DataLoader:
    """The held-out episodes' loader without worker processes: samples come in index order, so
    batches hold the frames LeRobot's sequential eval loader batches (workers would interleave them)."""
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        num_workers=0,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
    )


def _save_checkpoint(original: Any, run: type[_Run]) -> Any:
    def save_checkpoint(checkpoint_dir: Path, *args: Any, **kwargs: Any) -> None:
        original(checkpoint_dir, *args, **kwargs)
        if run.loader is not None:
            target = Path(checkpoint_dir) / "training_state" / DATA_STATE_NAME
            tmp = target.with_suffix(".tmp")
            state = {**run.loader.state_dict(), SETTINGS_KEY: run.settings.recorded()}
            tmp.write_text(json.dumps(state, sort_keys=True))
            os.replace(tmp, target)

    return save_checkpoint


def train(argv: Sequence[str]) -> None:
    """Run LeRobot's ``lerobot-train`` with ``argv`` (its arguments), our loader in place of its dataset."""
    given, argv = split_args(argv)
    if "--help" in argv or "-h" in argv:
        print(usage(), flush=True)
    check_lerobot()
    if train_process.applied:
        print(
            f"lerobot-shards train: {'; '.join(train_process.applied)} (same bits, less CPU)",
            file=sys.stderr,
            flush=True,
        )
    import accelerate
    from lerobot.scripts import lerobot_train as lt

    run = type("Run", (_Run,), {})
    patches = {
        (lt, "make_train_eval_datasets"): _make_datasets(lt.make_train_eval_datasets, run, argv, given),
        (lt, "save_checkpoint"): _save_checkpoint(lt.save_checkpoint, run),
        (accelerate, "Accelerator"): _accelerator_class(accelerate.Accelerator, run),
    }
    saved = {key: getattr(*key) for key in patches}
    old_argv = sys.argv
    try:
        for (module, name), value in patches.items():
            setattr(module, name, value)
        sys.argv = ["lerobot-train", *argv]
        lt.main()
    finally:
        sys.argv = old_argv
        for (module, name), value in saved.items():
            setattr(module, name, value)
