"""The loader: ``EpisodePoolDataset`` streams converted shards (or a raw LeRobot v3.0 dataset);
``DeviceFeeder`` hands its uint8 batches to the training device as float."""

from .dataset import EpisodePoolDataset
from .feeder import DeviceFeeder

__all__ = ["DeviceFeeder", "EpisodePoolDataset"]
