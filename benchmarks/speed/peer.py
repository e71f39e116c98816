"""LeRobot's map-style dataset on the same window (runs inside the LeRobot 0.6.1 root)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from drive import drive
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from torch.utils.data import DataLoader

root, dtype, workers, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
info = json.load(open(os.path.join(root, "meta/info.json")))
cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
fps = info["fps"]
delta = {c: [-1 / fps, 0.0] for c in cams} | {"action": [i / fps for i in range(50)]}
kw = {"return_uint8": True} if dtype == "uint8" else {}
ds = LeRobotDataset("local/bench", root=root, delta_timestamps=delta, **kw)
loader = DataLoader(
    ds,
    batch_size=16,
    shuffle=True,
    num_workers=workers,
    prefetch_factor=4 if workers else None,
    generator=torch.Generator().manual_seed(0),
)
print(json.dumps(drive(loader, batches=batches)))
