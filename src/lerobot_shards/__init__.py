"""lerobot-shards: repack LeRobot v3.0 datasets into episode-aligned tar shards and stream them."""

from .exceptions import LeRobotShardsError

__version__ = "0.1.0"
__all__ = ["LeRobotShardsError", "__version__"]
