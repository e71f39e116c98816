"""Running a conversion: claim the destination, build this task's missing shards, write the manifest.

Order of writes: ``convert.json`` (the run's options) first, then per shard its tar and then
its sidecar, the manifest last once every shard of the plan has a sidecar. A shard counts as
done only when its sidecar exists, names the planned episodes and matches the tar's sha256
(``shard_status``), so a re-run after a kill rebuilds exactly the shards that are not complete.
"""

from __future__ import annotations

import ctypes
import json
import logging
import logging.handlers
import multiprocessing as mp
import os
import posixpath
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .. import __version__
from ..depth import DepthError, DepthParams, depth_params
from ..exceptions import ConvertError
from ..format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARDS_DIR,
    SIDECAR_PACK_NAME,
    FrameTransform,
    Manifest,
    PackRecord,
    ShardRecord,
    Sidecar,
    shard_name,
    sidecar_digest,
    sidecar_name,
)
from ..lerobot_v3 import LeRobotV3Source
from ..redaction import quiet_storage_loggers, without_credentials
from ..resize import resized_features
from ..shard_plan import PlannedShard
from ..storage import StorageLocation
from .destination import LEROBOT_INFO, OWN_TOP_FILE, RUN_RECORD, Destination, DestinationBusy, overlap
from .plan import DEFAULT_RUN, ConvertOptions, RunOptions, make_plan, plan_digest, task_share
from .shard_status import shard_status
from .shard_writer import EpisodeCallback, build_shard

log = logging.getLogger(__name__)

RUN_RECORD_FORMAT = "lerobot-shards-convert"


def _source_url(source: str | Path) -> str:
    """The source as ``convert.json`` and the manifest record it: absolute, without credentials."""
    text = str(source)
    return without_credentials(text) if "://" in text else os.path.abspath(text)


def run_record(
    source_url: str, options: ConvertOptions, plan: Sequence[PlannedShard], source_sha256: str
) -> dict[str, Any]:
    """What ``convert.json`` holds: everything that decides the output bytes, nothing that does not
    (workers, task split), so every task and re-run of one conversion writes the same record. The
    source's content digest (``LeRobotV3Source.content_digest``) makes a source rewritten between a
    killed run and its re-run, or between array tasks, another conversion, not a silent mix."""
    return {
        "format": RUN_RECORD_FORMAT,
        "converter_version": __version__,
        "source": source_url,
        "source_sha256": source_sha256,
        "options": options.to_dict(),
        "plan_sha256": plan_digest(list(plan)),
    }


def _check_claim(dest: Destination, record: dict[str, Any], *, overwrite: bool) -> bool:
    """Make sure ``dest`` is empty or this conversion's own output (reads only).

    Returns True when the destination must be cleared (``overwrite`` of other output).
    """
    if dest.is_local and os.path.lexists(dest.root) and not os.path.isdir(dest.root):
        raise ConvertError(f"{dest.root}: exists and is not a folder; choose another destination (nothing was written)")
    refuse_lerobot_dataset(dest)
    if dest.exists(RUN_RECORD):
        try:
            theirs = json.loads(dest.read_bytes(RUN_RECORD))
        except json.JSONDecodeError:
            theirs = {}
        if theirs == record:
            log.info("%s holds this conversion's output: resuming", dest.url)
            return False
        if "source_sha256" not in theirs and theirs == {k: v for k, v in record.items() if k != "source_sha256"}:
            log.warning(
                "%s holds this conversion's output, recorded before source digests: resuming without "
                "checking that the source is unchanged since it started",
                dest.url,
            )
            return False
        if not overwrite:
            diff = sorted(k for k in set(record) | set(theirs) if record.get(k) != theirs.get(k))
            changed = " (the source's files changed since it started)" if "source_sha256" in diff else ""
            raise ConvertError(
                f"{dest.path(RUN_RECORD)}: {dest.url} holds a conversion with other settings (differs in: "
                f"{', '.join(diff)}){changed}; pass --overwrite to replace it or choose another destination"
            )
        return True
    if [e for e in dest.entries() if not OWN_TOP_FILE.fullmatch(e)] and not overwrite:
        raise ConvertError(
            f"{dest.url} is not empty and holds no {RUN_RECORD}, so it is not lerobot-shards output: "
            f"refusing to write into it (pass --overwrite to replace its shards, or choose another destination)"
        )
    return overwrite


def refuse_lerobot_dataset(dest: Destination) -> None:
    """Refuse, whatever the flags, a destination holding a LeRobot dataset (``meta/info.json``): a
    conversion written beside it would shadow it (loaders read ``manifest.json`` first)."""
    if dest.exists(LEROBOT_INFO):
        raise ConvertError(
            f"{dest.path(LEROBOT_INFO)}: {without_credentials(dest.url)} holds a LeRobot dataset; refusing to write "
            "a conversion into it, even with --overwrite (nothing was written): choose another destination"
        )


def _claim(dest: Destination, record: dict[str, Any], *, clear: bool) -> None:
    """Write the run record (after clearing a replaced conversion's files)."""
    if clear:
        dest.clear_own_files()
        foreign = [e for e in dest.entries() if e != SHARDS_DIR and not OWN_TOP_FILE.fullmatch(e)]
        if foreign:
            log.warning("--overwrite: leaving unrelated entries in %s alone: %s", dest.url, ", ".join(foreign))
    created = dest.create_bytes(RUN_RECORD, json.dumps(record, indent=1, sort_keys=True).encode())
    if not created or not dest.is_local:
        # Read back: a task started at the same moment (with other options?) may have written its
        # record first; remotely, a later writer may have replaced ours.
        _check_claim(dest, record, overwrite=False)


def claim(dest: Destination, record: dict[str, Any], *, overwrite: bool) -> None:
    """Check and claim ``dest`` in one step, for callers holding the destination's whole lock (``upload``)."""
    _claim(dest, record, clear=_check_claim(dest, record, overwrite=overwrite))


def _shard_done(dest: Destination, shard: PlannedShard, present: set[str], *, skip_bad_episodes: bool) -> bool:
    """Resume keeps a shard that is complete (its sha256 checked) and holds the planned episodes."""
    status = shard_status(dest, shard_name(shard.index), sidecar_name(shard.index), present=present, check_sha256=True)
    if not status.complete or status.sidecar is None or not status.holds(shard.episodes):
        return False
    if status.sidecar.format_version != FORMAT_VERSION:
        return False  # an older format (say, without member checksums): rebuild rather than mix
    # Without --skip-bad-episodes a skipped episode must fail again, not vanish.
    return skip_bad_episodes or not status.sidecar.skipped


def write_shard(
    source: LeRobotV3Source,
    dest: Destination,
    shard: PlannedShard,
    options: ConvertOptions,
    *,
    run: RunOptions = DEFAULT_RUN,
    on_episode: EpisodeCallback | None = None,
) -> Sidecar:
    """Build one shard into ``dest``: the tar appears complete, then its sidecar."""
    with dest.staging(posixpath.join(SHARDS_DIR, shard_name(shard.index))) as f:
        sidecar = build_shard(source, shard, options, f, run=run, on_episode=on_episode)
    dest.write_bytes(posixpath.join(SHARDS_DIR, sidecar_name(shard.index)), sidecar.to_json().encode())
    return sidecar


# -- worker processes ---------------------------------------------------------------------------

PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` dies, even by SIGKILL (which runs no clean-up there).

    Linux: the kernel sends SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG). Everywhere,
    and in case the parent died before that was set: a daemon thread polls the parent's pid.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still works

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # no clean-up: the parent's re-run removes our temporary files

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


@dataclass(frozen=True)
class _WorkerSetup:
    """What a spawned worker process needs to build shards, sent once when it starts."""

    source: tuple[str, dict[str, Any]]  # url, storage options
    data_files: StorageLocation | None  # the source's data files root, with its own options
    dest: tuple[str, dict[str, Any]]
    options: ConvertOptions
    run: RunOptions
    log_level: int
    parent_pid: int


@dataclass(frozen=True)
class _Worker:
    source: LeRobotV3Source
    dest: Destination
    options: ConvertOptions
    run: RunOptions
    queue: Any  # progress and log records to the parent


_worker: list[_Worker] = []  # this worker process's, set by _init_worker
_init_failed: list[BaseException] = []  # why _init_worker could not set it: raised by each shard's task


def _init_worker(setup: _WorkerSetup, queue: Any) -> None:
    die_with_parent(setup.parent_pid)
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(queue)]
    root.setLevel(setup.log_level)
    quiet_storage_loggers()
    try:  # an initializer's error breaks the pool ("terminated abruptly"): raise it with the first task
        source = LeRobotV3Source(
            setup.source[0],
            storage_options=setup.source[1],
            allow_missing_files=setup.run.skip_bad_episodes,
            data_files=setup.data_files,
        )
        dest = Destination(setup.dest[0], storage_options=setup.dest[1])
    except Exception as e:
        _init_failed[:] = [e]
        return
    _worker[:] = [_Worker(source, dest, setup.options, setup.run, queue)]


def _worker_shard(shard: PlannedShard) -> int:
    if _init_failed:
        raise _init_failed[0]
    w = _worker[0]
    write_shard(
        w.source, w.dest, shard, w.options, run=w.run, on_episode=lambda frames, size: w.queue.put((frames, size))
    )
    return shard.index


class _Progress:
    """Episodes bar with rate and ETA, plus output MB/s in the postfix."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.bar = tqdm(
            total=total, initial=initial, unit="ep", desc="convert", disable=not enabled, dynamic_ncols=True
        )
        self.start = time.monotonic()
        self.bytes = 0
        self.frames = 0

    def episode(self, frames: int, size: int) -> None:
        self.bytes += size
        self.frames += frames
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self.bar.set_postfix_str(
            f"{self.bytes / 1e6 / elapsed:.1f} MB/s, {self.frames / elapsed:.0f} frames/s", refresh=False
        )
        self.bar.update(1)

    def drain(self, queue: Any) -> None:
        while not queue.empty():
            item = queue.get()
            if isinstance(item, logging.LogRecord):
                logging.getLogger(item.name).handle(item)
            else:
                self.episode(*item)


def _run_shards(
    source: LeRobotV3Source,
    source_options: dict[str, Any],
    dest: Destination,
    dest_options: dict[str, Any],
    todo: list[PlannedShard],
    options: ConvertOptions,
    run: RunOptions,
    progress: _Progress,
) -> None:
    if run.workers <= 1 or len(todo) <= 1:
        for shard in todo:
            write_shard(source, dest, shard, options, run=run, on_episode=progress.episode)
        return
    ctx = mp.get_context("spawn")  # no fork: PyAV/arrow thread pools do not survive it
    queue = ctx.Queue()
    setup = _WorkerSetup(
        (source.url, source_options),
        source.data_files,
        (dest.url, dest_options),
        options,
        run,
        logging.getLogger("lerobot_shards").getEffectiveLevel(),
        os.getpid(),
    )
    try:
        with ProcessPoolExecutor(
            min(run.workers, len(todo)), mp_context=ctx, initializer=_init_worker, initargs=(setup, queue)
        ) as pool:
            pending = {pool.submit(_worker_shard, shard) for shard in todo}
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    progress.drain(queue)
                    for future in done:
                        try:
                            future.result()
                        except BrokenProcessPool as e:
                            raise ConvertError(
                                f"{dest.url}: a conversion worker process exited abruptly (killed, out of memory, or "
                                "it could not start: the workers are spawned and import the main script, so a script "
                                "calling convert_dataset with workers > 1 must call it under "
                                '`if __name__ == "__main__":`); re-run to resume'
                            ) from e
            except BaseException:
                for future in pending:
                    future.cancel()
                log.error("stopping: waiting for the shards in progress to finish")
                raise
    finally:
        progress.drain(queue)  # the workers have exited: everything they sent is in the queue now


# -- manifest -----------------------------------------------------------------------------------


def finalize(
    dest: Destination,
    source: LeRobotV3Source,
    plan: Sequence[PlannedShard],
    options: ConvertOptions,
    record: dict[str, Any],
) -> Manifest:
    """Write ``manifest.json`` from all sidecars; fails listing every shard that is missing."""
    present = set(dest.entries(SHARDS_DIR))
    sidecars: list[Sidecar] = []
    digests: list[tuple[str | None, int | None]] = []  # each sidecar file's sha256 and size
    packed: list[bytes] = []  # each sidecar file's bytes, for sidecars.pack
    missing: list[str] = []
    for shard in plan:
        tar, side = shard_name(shard.index), sidecar_name(shard.index)
        status = shard_status(dest, tar, side, present=present)  # no sha256: every shard would be read
        if status.sidecar is not None and not status.holds(shard.episodes):
            got = sorted([e.episode_index for e in status.sidecar.episodes] + list(status.sidecar.skipped))
            raise ConvertError(
                f"{dest.path(posixpath.join(SHARDS_DIR, side))}: holds episodes {got}, "
                f"the plan puts {sorted(shard.episodes)} in this shard"
            )
        if status.sidecar is None or not status.complete:
            missing.append(f"{tar} ({status.problem})")
            continue
        sidecars.append(status.sidecar)
        digests.append((status.sidecar_sha256, status.sidecar_bytes))
        packed.append(status.sidecar_data if status.sidecar.episodes else b"")  # as the manifest lists them
    if missing:
        raise ConvertError(
            f"{dest.url}: cannot write {MANIFEST_NAME}, {len(missing)} of {len(plan)} shards are missing or "
            f"incomplete: {'; '.join(missing)}. Run the tasks that own them (shard i belongs to task i % num_tasks)."
        )
    skipped = {ep: reason for s in sidecars for ep, reason in s.skipped.items()}
    if not any(s.episodes for s in sidecars):
        # Every episode was skipped (--skip-bad-episodes): an empty dataset is a failure, not a result.
        first = min(skipped, default=None)
        why = f"; episode {first}: {skipped[first]}" if first is not None else ""
        raise ConvertError(
            f"{dest.url}: no episode was converted ({len(skipped)} skipped{why}); {MANIFEST_NAME} not written"
        )
    video = options.video_settings()
    depth = _depth_cameras(source)
    sizes = options.camera_sizes(source.camera_keys, depth)
    if options.reencode is None:
        video["fallback_reencoded_episodes"] = sorted(
            e.episode_index
            for s in sidecars
            for e in s.episodes
            if not all(c.stream_copied for cam, c in e.clips.items() if cam not in sizes)
        )
    pack = b"".join(packed)  # every sidecar in one object: a loader's rank reads them with one GET
    dest.write_bytes(SIDECAR_PACK_NAME, pack)
    manifest = Manifest(
        source_info=source.info,
        source_stats=source.stats,
        tasks=source.tasks,
        fps=source.fps,
        features=resized_features(source.features, sizes, codec=options.codec),
        transforms=_camera_transforms(sidecars),
        depth=depth,
        cameras=tuple(sorted(source.camera_keys)),
        video=video,
        shards=tuple(
            ShardRecord(
                index=shard.index,
                name=s.shard,
                sidecar=sidecar_name(shard.index),
                episodes=tuple(e.episode_index for e in s.episodes),
                frames=s.num_frames,
                bytes=s.size,
                sha256=s.sha256,
                episode_lengths=tuple(e.length for e in s.episodes),
                sidecar_sha256=digest,
                sidecar_bytes=nbytes,
            )
            for shard, s, (digest, nbytes) in zip(plan, sidecars, digests)
            if s.episodes
        ),
        skipped_episodes=skipped,
        sidecar_pack=PackRecord(SIDECAR_PACK_NAME, len(pack), sidecar_digest(pack)),
        converter={"version": __version__, "arguments": {"source": record["source"], **record["options"]}},
    )
    dest.write_bytes(MANIFEST_NAME, manifest.to_json().encode())
    log.info(
        "wrote %s: %d shards, %d episodes, %d frames, %.1f MB; %d episodes skipped, %d re-encoded",
        dest.path(MANIFEST_NAME),
        len(manifest.shards),
        manifest.total_episodes,
        manifest.total_frames,
        manifest.total_bytes / 1e6,
        len(skipped),
        len(video.get("fallback_reencoded_episodes", ())),
    )
    return manifest


def _camera_transforms(sidecars: Sequence[Sidecar]) -> dict[str, FrameTransform]:
    """Each resized camera's transform for the manifest: the first clip's (all clips share it unless
    the source changes frame size between episodes, which is logged; sidecars keep every clip's)."""
    out: dict[str, FrameTransform] = {}
    for sidecar in sidecars:
        for entry in sidecar.episodes:
            for cam, clip in sorted(entry.clips.items()):
                if clip.transform is None:
                    continue
                first = out.setdefault(cam, clip.transform)
                if clip.transform != first:
                    log.warning(
                        "camera %s: episode %d was resized from %s, earlier episodes from %s (see the sidecars)",
                        cam,
                        entry.episode_index,
                        clip.transform.source,
                        first.source,
                    )
    return out


def _depth_cameras(src: LeRobotV3Source) -> dict[str, DepthParams]:
    """The depth cameras' quantizers as LeRobot reads them (the manifest records them); a field that
    is no quantizer fails naming the camera, before anything is written."""
    found = {}
    for cam in src.camera_keys:
        try:
            params = depth_params(src.features[cam], f"{src.url}: camera {cam!r}")
        except DepthError as e:
            raise ConvertError(str(e)) from None
        if params is not None:
            found[cam] = params
    return found


def _check_resize(src: LeRobotV3Source, options: ConvertOptions) -> None:
    """Unknown cameras, a resized depth camera and a depth camera's bad quantizer fail before anything
    is written; upscaling is allowed but logged."""
    for cam, (h, w) in options.camera_sizes(src.camera_keys, _depth_cameras(src)).items():
        info = src.features[cam].get("info", {})
        sh, sw = info.get("video.height"), info.get("video.width")
        if isinstance(sh, int) and isinstance(sw, int) and (h > sh or w > sw):
            log.warning("camera %s: --resize %dx%d is larger than the source's %dx%d (upscaling)", cam, w, h, sw, sh)


# -- entry point --------------------------------------------------------------------------------


def convert_dataset(
    source: str | Path,
    dest: str | Path,
    options: ConvertOptions | None = None,
    *,
    run: RunOptions | None = None,
    source_options: dict[str, Any] | None = None,
    dest_options: dict[str, Any] | None = None,
    data_files_root: StorageLocation | str | None = None,
    **run_options: Any,
) -> Manifest | None:
    """Convert a LeRobot v3.0 dataset at ``source`` into tar shards at ``dest`` (both local or fsspec URLs).

    ``options`` decide the output bytes (default ``ConvertOptions()``); ``run`` (``RunOptions``, or
    its fields as keywords: ``workers=4``, ``skip_bad_episodes=True``) decides only how the work
    is run. Re-running resumes. With ``num_tasks`` > 1 each task converts shards
    ``i % num_tasks == task_index``; the task that completes the plan writes the manifest and
    returns it, the others return None. ``finalize_only`` converts nothing and writes the
    manifest (or fails naming missing shards). ``data_files_root``: where the source's parquet and
    mp4 files are when not beside its metadata (a ``StorageLocation`` with its own storage options,
    or a URL or path opened with none; ``source_options`` never go to it).
    """
    if run is not None and run_options:
        raise ValueError(f"{sorted(run_options)} given as keywords and run= given too: set them in run=")
    run = run or RunOptions(**run_options)
    source_options, dest_options = source_options or {}, dest_options or {}
    options = options or ConvertOptions()
    src = LeRobotV3Source(
        str(source),
        storage_options=source_options,
        allow_missing_files=run.skip_bad_episodes,
        data_files=data_files_root,
    )
    _check_resize(src, options)
    plan = make_plan(src, options)
    share = task_share(plan, run.num_tasks, run.task_index)
    mismatched = src.span_mismatches()
    if mismatched:
        log.warning(
            "%d of %d episodes (first: episode %d) have a video to_timestamp that disagrees with their rows; "
            "converting the frames their rows name, which their mp4s hold (episodes whose frames are missing or "
            "overlap another episode's still fail)",
            len(mismatched),
            len(src.episodes),
            mismatched[0],
        )
    _warn_stale_tasks(src)
    out = Destination(str(dest), storage_options=dest_options)
    _refuse_source_as_output(src, out)
    record = run_record(_source_url(source), options, plan, src.content_digest())
    clear = _check_claim(out, record, overwrite=run.overwrite)
    if run.finalize_only:
        try:
            with out.lock(None):  # --overwrite deletes: never under a running conversion
                _claim(out, record, clear=clear)
                return finalize(out, src, plan, options, record)
        except DestinationBusy as e:
            raise ConvertError(str(e)) from None
    try:
        with out.lock(None if clear else [s.index for s in share]):
            _claim(out, record, clear=clear)
            return _convert_share(src, source_options, out, dest_options, plan, share, options, record, run)
    except DestinationBusy as e:
        raise ConvertError(str(e)) from None


def _warn_stale_tasks(src: LeRobotV3Source) -> None:
    """Say once when meta/episodes' ``tasks`` name tasks meta/tasks.parquet lacks (it was edited alone):
    each episode is converted with the tasks its rows' task_index names there, as LeRobot reads them."""
    stale = src.stale_task_episodes()
    if stale:
        log.warning(
            "%d of %d episodes (first: episode %d) list tasks in %s/meta/episodes that %s/meta/tasks.parquet "
            "lacks; converting the tasks their rows' task_index names in meta/tasks.parquet, as LeRobot reads them",
            len(stale),
            len(src.episodes),
            stale[0],
            without_credentials(src.url),
            without_credentials(src.url),
        )


def _refuse_source_as_output(src: LeRobotV3Source, out: Destination) -> None:
    """Refuse a destination that is the source, lies inside it or holds it, before anything is
    written: shards, manifest and ``convert.json`` would be written into the user's dataset (and
    with ``--overwrite`` its files replaced), so no flag allows it."""
    relation = overlap(out.fs, out.root, src.fs, src.root)
    if relation is None and src.data_files is not None:
        relation = overlap(out.fs, out.root, src.data_fs, src.data_root)
    if relation is not None:
        raise ConvertError(
            f"{without_credentials(out.url)}: {relation} the source dataset {without_credentials(src.url)}; "
            "refusing to write the conversion there (nothing was written): choose a destination outside the source"
        )


def _convert_share(
    src: LeRobotV3Source,
    source_options: dict[str, Any],
    out: Destination,
    dest_options: dict[str, Any],
    plan: list[PlannedShard],
    share: list[PlannedShard],
    options: ConvertOptions,
    record: dict[str, Any],
    run: RunOptions,
) -> Manifest | None:
    """Build this task's missing shards (its lock held), then the manifest when the plan is complete."""
    stale = out.remove_stale_tmp(SHARDS_DIR, [shard_name(s.index).removesuffix(".tar") + "." for s in share])
    if stale:
        log.info("removed %d temporary files of an interrupted run", stale)
    present = set(out.entries(SHARDS_DIR))
    todo = [s for s in share if not _shard_done(out, s, present, skip_bad_episodes=run.skip_bad_episodes)]
    log.info(
        "plan: %d shards, %d episodes, %d frames; task %d/%d owns %d shards, %d already complete",
        len(plan),
        len(src.episodes),
        src.total_frames,
        run.task_index,
        run.num_tasks,
        len(share),
        len(share) - len(todo),
    )
    done_eps = sum(len(s.episodes) for s in share if s not in todo)
    bar = _Progress(sum(len(s.episodes) for s in share), done_eps, run.progress)
    with logging_redirect_tqdm(), bar.bar:
        _run_shards(src, source_options, out, dest_options, todo, options, run, bar)

    present = set(out.entries(SHARDS_DIR))
    if run.num_tasks > 1 and not all(sidecar_name(s.index) in present for s in plan):
        log.info(
            "task %d/%d done; the manifest waits for the other tasks' shards (or run with --finalize)",
            run.task_index,
            run.num_tasks,
        )
        return None
    return finalize(out, src, plan, options, record)
