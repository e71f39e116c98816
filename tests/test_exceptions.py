"""One base exception for the package; the loader's error types are exported where users import the loader."""

from __future__ import annotations

import importlib
import pkgutil

import lerobot_shards
from lerobot_shards import LeRobotShardsError
from lerobot_shards.convert import ConvertError

# Modules of an integration whose library is not our dependency (LeRobot brings torchvision).
NEEDS_OTHERS = {"lerobot_shards.integrations.image_kernels": "torchvision"}


def test_every_exception_the_package_defines_derives_from_the_base() -> None:
    defined = {}
    for module in pkgutil.walk_packages(lerobot_shards.__path__, "lerobot_shards."):
        try:
            mod = importlib.import_module(module.name)
        except ModuleNotFoundError as missing:
            if missing.name != NEEDS_OTHERS.get(module.name):
                raise
            continue
        for value in vars(mod).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.name:
                defined[value.__qualname__] = value
    assert len(defined) >= 11 and ConvertError in defined.values()
    assert all(issubclass(cls, LeRobotShardsError) for cls in defined.values()), defined


def test_the_loader_exports_its_errors_with_their_builtin_bases() -> None:
    from lerobot_shards import loader

    assert issubclass(loader.IntegrityError, ValueError) and issubclass(loader.FormatError, ValueError)
    assert issubclass(loader.DecodeError, RuntimeError) and issubclass(loader.SourceError, ValueError)
    for name in ("IntegrityError", "DecodeError", "FormatError", "SourceError", "UnsafeNameError"):
        assert issubclass(getattr(loader, name), loader.LeRobotShardsError) and name in loader.__all__
