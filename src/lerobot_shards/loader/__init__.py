"""The loader: ``EpisodePoolDataset`` streams converted shards (or a raw LeRobot v3.0 dataset);
``DeviceFeeder`` hands its uint8 batches to the training device as float; ``SlabCollate`` (or
``slab_loader``) carries worker batches to the main process in reused shared memory."""

from .dataset import EpisodePoolDataset
from .feeder import DeviceFeeder
from .transport import SlabCollate, slab_loader

__all__ = ["DeviceFeeder", "EpisodePoolDataset", "SlabCollate", "slab_loader"]
