"""The loader: ``EpisodePoolDataset`` streams converted shards (or a raw LeRobot v3.0 dataset);
``MixtureDataset`` mixes several by weight;
``DeviceFeeder`` hands its uint8 batches to the training device as float; ``SlabCollate`` (or
``slab_loader``) carries worker batches to the main process in reused shared memory. Its options
(``OrderOptions``, ``ReadOptions``, ``DecodeOptions``) and the errors it raises are exported here,
each error a ``LeRobotShardsError``."""

from ..exceptions import LeRobotShardsError
from ..format import FormatError
from ..lerobot_v3 import SourceError
from ..names import UnsafeNameError
from .dataset import EpisodePoolDataset
from .decode import DecodeError
from .feeder import DeviceFeeder
from .integrity import IntegrityError
from .mixture import Mixture, MixtureDataset, MixtureError, MixtureResumeError, MixtureSource, load_mixture
from .mixture_spec import MixtureFileError
from .options import DecodeOptions, OrderOptions, ReadOptions
from .transport import SlabCollate, slab_loader, with_slabs

__all__ = [
    "DecodeError",
    "DecodeOptions",
    "DeviceFeeder",
    "EpisodePoolDataset",
    "FormatError",
    "IntegrityError",
    "LeRobotShardsError",
    "Mixture",
    "MixtureDataset",
    "MixtureError",
    "MixtureFileError",
    "MixtureResumeError",
    "MixtureSource",
    "OrderOptions",
    "ReadOptions",
    "SlabCollate",
    "SourceError",
    "UnsafeNameError",
    "load_mixture",
    "slab_loader",
    "with_slabs",
]
