"""The loader: ``EpisodePoolDataset`` streams converted shards (or a raw LeRobot v3.0 dataset);
``MixtureDataset`` mixes several by weight;
``DeviceFeeder`` hands its uint8 batches to the training device as float; ``SlabCollate`` (or
``slab_loader``) carries worker batches to the main process in reused shared memory. Its options
(``OrderOptions``, ``ReadOptions``, ``DecodeOptions``) and the errors it raises are exported here,
each error a ``LeRobotShardsError``."""

import importlib
import sys

from ..exceptions import LeRobotShardsError
from ..format import FormatError
from ..lerobot_v3 import SourceError
from ..names import UnsafeNameError
from .dataset import EpisodePoolDataset
from .decoding.decoders import DecodeError
from .mix.dataset import Mixture, MixtureDataset, MixtureError, MixtureResumeError, MixtureSource, load_mixture
from .mix.spec import MixtureFileError
from .options import DecodeOptions, OrderOptions, ReadOptions
from .read.integrity import IntegrityError
from .transport.feeder import DeviceFeeder
from .transport.slabs import SlabCollate, slab_loader, with_slabs

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

# The modules' paths before the loader was split into sub-packages (plan/, read/, decoding/,
# transport/, mix/): the same module objects stay importable under the old names, so code and
# pickles that name them keep working (``transport`` is itself a package now and re-exports).
_MOVED = {
    "cache": "read.shard_cache",
    "checkpoint": "plan.order",
    "decode": "decoding.decoders",
    "device": "transport.device",
    "elastic": "plan.elastic",
    "feeder": "transport.feeder",
    "integrity": "read.integrity",
    "mixture": "mix.dataset",
    "mixture_layout": "mix.layout",
    "mixture_order": "mix.order",
    "mixture_spec": "mix.spec",
    "partition": "plan.partition",
    "reader": "read.reader",
    "remote": "read.remote",
    "resume": "plan.resume",
    "sampling": "plan.sampling",
    "shutdown": "transport.shutdown",
    "sources": "read.sources",
    "windows": "plan.windows",
}
for _old, _new in _MOVED.items():
    globals()[_old] = sys.modules[f"{__name__}.{_old}"] = importlib.import_module(f".{_new}", __name__)
