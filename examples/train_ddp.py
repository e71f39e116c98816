"""A minimal DDP training loop on EpisodePoolDataset, with preemption-safe resume.

Run on one machine:   torchrun --nproc-per-node 2 examples/train_ddp.py DATASET --ckpt ckpt.pt
On SLURM:             sbatch slurm/train.sbatch DATASET

The data position is three integers in the checkpoint: {epoch, batches_consumed, batch_size}.
After a kill, the same command resumes with exactly the batches an uninterrupted run would see.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dataset", help="converted dataset (or raw LeRobot v3.0 folder), local or fsspec URL")
    p.add_argument("--ckpt", default="ckpt.pt")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (simulates preemption)")
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else "cpu"

    ds = EpisodePoolDataset(
        args.dataset,
        delta_timestamps={"action": [i / 30 for i in range(10)]},
        episode_pool_size=8,
        equal_samples_per_rank=True,  # same batch count on every rank: DDP cannot hang at epoch end
        cache_dir=args.cache_dir,
        image_dtype=torch.uint8,  # convert on the GPU, not in the workers
    )
    state_dim = ds.features["observation.state"]["shape"][0]
    action_dim = ds.features["action"]["shape"][0]
    model = torch.nn.Linear(state_dim, action_dim * 10).to(device)
    if distributed:
        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    start_epoch, consumed, step = 0, 0, 0
    if Path(args.ckpt).exists():
        ckpt = torch.load(args.ckpt, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        ds.load_state_dict(ckpt["data"])
        start_epoch, consumed, step = ckpt["data"]["epoch"], ckpt["data"]["batches_consumed"], ckpt["step"]

    for epoch in range(start_epoch, args.epochs):
        if epoch != start_epoch:
            ds.set_epoch(epoch)
            consumed = 0
        for batch in DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers):
            pred = model(batch["observation.state"].to(device))
            loss = torch.nn.functional.mse_loss(pred, batch["action"].flatten(1).to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            consumed += 1
            step += 1
            if int(os.environ.get("RANK", 0)) == 0 and step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}", flush=True)
                torch.save(
                    {
                        "model": model.state_dict(),
                        "opt": opt.state_dict(),
                        "step": step,
                        "data": ds.state_dict(batches_consumed=consumed, batch_size=args.batch_size),
                    },
                    args.ckpt,
                )
            if args.max_steps and step >= args.max_steps:
                return
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
