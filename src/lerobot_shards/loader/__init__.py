"""The loader: ``EpisodePoolDataset`` streams converted shards (or a raw LeRobot v3.0 dataset)."""

from .dataset import EpisodePoolDataset

__all__ = ["EpisodePoolDataset"]
