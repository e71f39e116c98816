"""Our loader, default settings (plus JSON overrides): steady samples/s and CPU ms per sample."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import torch
from drive import drive
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset

src, dtype, workers, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
probe = EpisodePoolDataset(src)
fps = probe.fps
delta = {c: [-1 / fps, 0.0] for c in probe.cameras} | {"action": [i / fps for i in range(50)]}
ds = EpisodePoolDataset(
    src, delta_timestamps=delta, image_dtype=torch.uint8 if dtype == "uint8" else torch.float32, **extra
)
loader = DataLoader(ds, batch_size=16, num_workers=workers)
print(json.dumps(drive(loader, batches=batches)))
