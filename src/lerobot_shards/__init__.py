"""lerobot-shards: repack LeRobot v3.0 datasets into episode-aligned tar shards and stream them."""

__version__ = "0.1.0"
