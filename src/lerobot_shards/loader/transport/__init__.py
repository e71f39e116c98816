"""Moving batches: worker to main process through shared-memory slabs (``slabs``), to the
training device (``feeder``, ``device``), and the background threads' orderly stop (``shutdown``).

Code written before ``transport.py`` became this package still imports from here: ``SlabCollate``,
``slab_loader`` and ``with_slabs`` are re-exported, and any other name of the old module is looked
up in ``slabs``.
"""

from typing import Any

from . import slabs
from .slabs import SlabCollate, slab_loader, with_slabs

__all__ = ["SlabCollate", "slab_loader", "with_slabs"]


def __getattr__(name: str) -> Any:
    try:
        return getattr(slabs, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
