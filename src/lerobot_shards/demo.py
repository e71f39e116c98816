"""The main job on a built-in default dataset: synthesize, convert, stream, report throughput.

Idempotent: a dataset or conversion already in the output folder is reused, so running it
again only repeats the streaming measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import DataLoader

from .format import Manifest
from .loader import EpisodePoolDataset
from .synth import read_identity, synth_dataset

CAMERAS = ("observation.images.front", "observation.images.top")


@dataclass(frozen=True)
class DemoResult:
    source: Path
    converted: Path
    episodes: int
    frames: int
    shards: int
    samples: int
    seconds: float
    identity_checked: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def build_demo_data(
    out: str | Path,
    *,
    episodes: int = 24,
    length_range: tuple[int, int] = (60, 120),
    num_workers: int = 2,
    progress: bool = True,
) -> Manifest:
    """Make (or reuse) the default dataset in ``out/source`` and its conversion in ``out/converted``.

    README and docs/ name these two folders in their examples; the snippet tests
    (tests/test_docs.py) build a smaller set the same way, so the examples run on what the
    demo makes.
    """
    from .convert.plan import ConvertOptions
    from .convert.run import convert_dataset

    out = Path(out)
    source = out / "source"
    if not (source / "meta/info.json").exists():
        synth_dataset(
            source,
            num_episodes=episodes,
            cameras=CAMERAS,
            height=96,
            width=160,
            length_range=length_range,
            episodes_per_video_file=8,
            episodes_per_data_file=8,
            seed=0,
        )
    converted = out / "converted"
    manifest = convert_dataset(
        source, converted, ConvertOptions(episodes_per_shard=2), workers=num_workers, progress=progress
    )
    if manifest is None:
        raise RuntimeError(f"{converted}: conversion did not finish")
    return manifest


def run_demo(
    out: str | Path,
    *,
    episodes: int = 24,
    batches: int = 30,
    batch_size: int = 16,
    num_workers: int = 2,
    progress: bool = True,
) -> DemoResult:
    """Make (or reuse) the default dataset under ``out``, convert it, and stream batches from it."""
    out = Path(out)
    source, converted = out / "source", out / "converted"
    manifest = build_demo_data(out, episodes=episodes, num_workers=num_workers, progress=progress)
    fps = manifest.fps
    ds = EpisodePoolDataset(
        str(converted),
        delta_timestamps={CAMERAS[0]: [-1 / fps, 0.0], "action": [0.0, 1 / fps, 2 / fps]},
        episode_pool_size=4,
        seed=0,
    )
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    samples = checked = 0
    start = time.perf_counter()
    for i, batch in enumerate(loader):
        if i == batches:
            break
        samples += len(batch["index"])
        # Every frame we return must be the frame that was asked for.
        for j in range(len(batch["index"])):
            want = (int(batch["episode_index"][j]), int(batch["frame_index"][j]))
            if read_identity(batch[CAMERAS[0]][j, -1]) != want or read_identity(batch[CAMERAS[1]][j]) != want:
                raise RuntimeError(f"frame identity mismatch in batch {i}: wanted {want}")
            checked += 1
    seconds = time.perf_counter() - start
    return DemoResult(
        source=source,
        converted=converted,
        episodes=manifest.total_episodes,
        frames=manifest.total_frames,
        shards=len(manifest.shards),
        samples=samples,
        seconds=seconds,
        identity_checked=checked,
    )


def format_result(r: DemoResult) -> str:
    return "\n".join(
        [
            f"source     {r.source}",
            f"converted  {r.converted}  ({r.episodes} episodes, {r.frames} frames, {r.shards} shards)",
            f"streamed   {r.samples} samples in {r.seconds:.2f} s = {r.samples_per_s:.1f} samples/s "
            f"(2 cameras, a 2-frame window on one; first batch included)",
            f"identity   {r.identity_checked} samples checked: every frame is the frame asked for",
        ]
    )
