"""Train a small policy on an EpisodePoolDataset (or a MixtureDataset) across ranks, and survive kills.

    torchrun --nproc-per-node 8 examples/train.py DATASET --ckpt run/ckpt.pt      # one node
    accelerate launch examples/train.py DATASET --ckpt run/ckpt.pt              # same env vars
    DATASET=s3://bucket/ds CKPT=/shared/run/ckpt.pt sbatch slurm/train.sbatch   # SLURM, requeued
    python examples/train.py DATASET --dummy                                     # loading only

DATASET may be a mixture file (``.yaml``/``.yml``/``.json``, README "Mixing datasets"): the
run reads a ``MixtureDataset`` over its sources instead (``open_dataset``), with the same options.
Rank, world size and GPU come from the launcher's RANK / WORLD_SIZE / LOCAL_RANK. Workers emit
uint8 frames and ``DeviceFeeder`` copies them to the GPU and converts them there. The policy is
deliberately small (a state MLP plus a small CNN over one camera, predicting an action chunk);
``--dummy`` drops it to measure pure loading (samples/s and how long the loop waited for data).

Every ``--ckpt-every`` steps rank 0 writes model, optimizer, every rank's RNG and the data
position ``{epoch, batches_consumed, batch_size}`` atomically (temporary file, fsync, rename).
Re-running the same command resumes from it, and the run ends with exactly the parameters an
uninterrupted run ends with: compare the ``final-params-sha256`` line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lerobot_shards.loader import DeviceFeeder, EpisodePoolDataset, MixtureDataset, slab_loader
from lerobot_shards.loader.mix.dataset import open_dataset


class Policy(nn.Module):
    """State MLP + small CNN over one camera -> an action chunk (chunk x action_dim)."""

    def __init__(self, state_dim: int, action_dim: int, chunk: int, camera: str | None) -> None:
        super().__init__()
        self.camera, self.chunk, self.action_dim = camera, chunk, action_dim
        self.state = nn.Sequential(nn.Linear(state_dim, 64), nn.ReLU())
        self.cnn = None
        width = 64
        if camera is not None:
            self.cnn = nn.Sequential(
                nn.Conv2d(3, 16, 5, stride=4),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
            width += 32
        self.head = nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, chunk * action_dim))

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        features = [self.state(batch["observation.state"])]
        if self.cnn is not None:
            features.append(self.cnn(batch[self.camera]))
        return self.head(torch.cat(features, dim=1)).view(-1, self.chunk, self.action_dim)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary name, fsync, rename: a kill leaves the old checkpoint or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "dataset", help="converted dataset (or raw LeRobot v3.0 folder), local path or fsspec URL, or a mixture file"
    )
    p.add_argument("--ckpt", default="ckpt.pt", help="checkpoint path (resumed from when it exists)")
    p.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--pool", type=int, default=8, help="episode_pool_size")
    p.add_argument("--chunk", type=int, default=10, help="action chunk length (frames)")
    p.add_argument("--camera", default=None, help="camera key for the CNN (default: the first; 'none' for state only)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=2, help="batches the feeder converts ahead")
    p.add_argument("--decode-device", default="cpu", help="video_decode_device: cpu or cuda (this rank's GPU)")
    p.add_argument("--dummy", action="store_true", help="no model: measure data loading only")
    p.add_argument("--step-time-ms", type=float, default=0.0, help="simulated extra compute per step")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    p.add_argument("--cache-dir", default=None, help="local directory for downloaded shards")
    p.add_argument("--episodes-per-shard", type=int, default=None, help="virtual shards of a raw LeRobot dataset")
    args = p.parse_args()
    for name in ("ckpt_every", "log_every", "epochs", "batch_size", "pool"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("max_steps", "workers"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be at least 0, got {getattr(args, name)}")

    world = int(os.environ.get("WORLD_SIZE", 1))
    distributed = world > 1
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    log = print if rank == 0 else (lambda *a, **k: None)

    def dataset(**kwargs: Any) -> EpisodePoolDataset | MixtureDataset:
        return open_dataset(
            args.dataset,
            episode_pool_size=args.pool,
            seed=args.seed,
            equal_samples_per_rank=True,  # same batch count on every rank: DDP cannot hang at epoch end
            cache_dir=args.cache_dir,
            image_dtype=torch.uint8,  # the feeder converts on the device
            video_decode_device=args.decode_device,
            episodes_per_shard=args.episodes_per_shard,
            **kwargs,
        )

    meta = dataset()  # fps and camera names (reads metadata only)
    cameras = list(meta.cameras)
    camera = None if args.camera == "none" else (args.camera or (cameras[0] if cameras else None))
    ds = dataset(
        delta_timestamps={"action": [i / meta.fps for i in range(args.chunk)]}, cameras=[camera] if camera else []
    )
    spawn = args.decode_device != "cpu" and args.workers > 0  # CUDA cannot start in forked workers
    loader = slab_loader(  # a DataLoader whose workers hand batches over in reused shared memory
        ds,
        batch_size=args.batch_size,
        num_workers=args.workers,
        multiprocessing_context="spawn" if spawn else None,
        generator=torch.Generator().manual_seed(args.seed),  # leaves the global RNG to the model
        # page-locked slabs: the feeder copies them to the GPU without pinning a copy first (frames
        # decoded on the GPU are no host memory to pin)
        pin_memory=cuda and args.decode_device == "cpu",
    )
    stats = ds.feature_stats if camera and camera in ds.feature_stats else None
    feeder = DeviceFeeder(loader, device, prefetch=args.prefetch, normalize=stats)

    torch.manual_seed(args.seed)
    model: nn.Module | None = None
    opt = None
    if not args.dummy:
        state_dim = ds.features["observation.state"]["shape"][0]
        action_dim = ds.features["action"]["shape"][0]
        model = Policy(state_dim, action_dim, args.chunk, camera).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ckpt_path = Path(args.ckpt)
    start_epoch, consumed, step, resumed = 0, 0, 0, False
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if model is not None:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
        ds.load_state_dict(ckpt["data"])
        set_rng_state(ckpt["rng"][rank])
        start_epoch, consumed, step, resumed = (
            ckpt["data"]["epoch"],
            ckpt["data"]["batches_consumed"],
            ckpt["step"],
            True,
        )
        log(f"resumed from {ckpt_path} at step {step} (epoch {start_epoch}, batch {consumed})", flush=True)
    ddp = model
    if distributed and model is not None:
        ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)

    def checkpoint() -> None:
        rngs: list[Any] = [None] * world
        if distributed:
            dist.all_gather_object(rngs, rng_state())
        else:
            rngs = [rng_state()]
        if rank == 0:
            save_atomic(
                {
                    "model": model.state_dict() if model is not None else None,
                    "opt": opt.state_dict() if opt is not None else None,
                    "rng": rngs,
                    "step": step,
                    "data": ds.state_dict(batches_consumed=consumed, batch_size=args.batch_size),
                },
                ckpt_path,
            )
            print(f"checkpoint step {step} epoch {epoch} batch {consumed}", flush=True)

    seen = hashlib.sha256()
    samples, started = 0, time.perf_counter()
    epoch = start_epoch
    for epoch in range(start_epoch, args.epochs):
        if not (resumed and epoch == start_epoch):
            ds.set_epoch(epoch)
            consumed = 0
        for batch in feeder:
            if ddp is not None:
                pred = ddp(batch)
                err = (pred - batch["action"]).abs() * ~batch["action_is_pad"].unsqueeze(-1)
                loss = err.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                seen.update(batch["index"].cpu().numpy().tobytes())
            if args.step_time_ms:
                time.sleep(args.step_time_ms / 1000)
            consumed += 1
            step += 1
            samples += len(batch["index"])
            if step % args.log_every == 0:
                s = feeder.stats()
                rate = samples * world / (time.perf_counter() - started)
                loss_text = f" loss {loss.item():.4f}" if ddp is not None else ""
                log(
                    f"step {step} epoch {epoch}{loss_text} samples/s {rate:.1f} (all ranks) "
                    f"wait p50 {s['wait_p50_s'] * 1e3:.1f} ms p95 {s['wait_p95_s'] * 1e3:.1f} ms "
                    f"queue empty {s['queue_empty']} full {s['queue_full']}",
                    flush=True,
                )
            if step % args.ckpt_every == 0:
                checkpoint()
            if args.max_steps and step >= args.max_steps:
                break
        if args.max_steps and step >= args.max_steps:
            break
    elapsed = time.perf_counter() - started
    s = feeder.stats()
    log(
        f"done: {step} steps, {samples * world} samples in {elapsed:.1f} s = {samples * world / elapsed:.1f} samples/s "
        f"(all ranks); loop waited p50 {s['wait_p50_s'] * 1e3:.1f} ms p95 {s['wait_p95_s'] * 1e3:.1f} ms per batch, "
        f"{s['wait_total_s'] / elapsed:.0%} of the time",
        flush=True,
    )
    if model is not None:
        log(f"final-params-sha256 {params_sha256(model)}", flush=True)
    else:
        log(f"seen-index-sha256 {seen.hexdigest()}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
