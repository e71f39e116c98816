"""Where a dataset is stored: one value, built once per dataset and passed down whole.

A ``StorageLocation`` holds the dataset's URL and its fsspec storage options with the loader's
timeouts and retries filled in (``timeouts.with_timeouts``; the user's own win). Building it
registers the options' secrets and endpoint and the URL's password with ``redaction`` (never
printed), and so does unpickling it: a spawned DataLoader worker starts with nothing registered.
Its file system is made on first use in each process, never inherited: a forked worker must not
use its parent's (an s3fs event loop and its connections belong to the process that made them).
Sources, the raw dataset's reader and the decoders all open files through it, so none of them
rebuilds the storage from ``(url, storage_options)``. A raw dataset whose data files (parquet, mp4)
live apart from its metadata (``data_files_root``: a bucket mirror, a local folder) has a second
one for them, with its own options: the converter and the loader both take it, hence top level.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .filesystems import url_to_fs
from .redaction import register_secrets, without_credentials
from .timeouts import with_timeouts


class StorageLocation:
    """A dataset's URL (or local path) and the storage options its files are opened with.

    ``options`` are the caller's with the timeout defaults added (a new dict: the caller's is never
    changed); ``fs`` and ``root`` are the file system and the URL's path in it, made lazily once
    per process. Picklable: only the URL and options travel.
    """

    def __init__(self, url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = os.fspath(url)
        self.options: dict[str, Any] = with_timeouts(self.url, dict(storage_options or {})) or {}
        self._opened: tuple[int, Any, str] | None = None  # (pid, fs, root)
        self._register()

    def _register(self) -> None:
        register_secrets(self.options)
        without_credentials(self.url)  # registers a URL's password as a secret: never printed

    def _open(self) -> tuple[Any, str]:
        if self._opened is None or self._opened[0] != os.getpid():
            fs, root = url_to_fs(self.url, **self.options)
            self._opened = (os.getpid(), fs, root)
        return self._opened[1], self._opened[2]

    @property
    def fs(self) -> Any:
        """The fsspec file system, this process's own."""
        return self._open()[0]

    @property
    def root(self) -> str:
        """The URL's path inside ``fs`` (no protocol, no trailing slash)."""
        return self._open()[1].rstrip("/")

    def at(self, url: str) -> StorageLocation:
        """Another URL on the same storage (a file of the dataset, its folder), with these options."""
        other = object.__new__(StorageLocation)
        other.url, other.options, other._opened = os.fspath(url), self.options, None
        without_credentials(other.url)
        return other

    def path(self, url: str) -> str:
        """A URL on this storage as a path inside ``fs``."""
        return str(self.fs._strip_protocol(url))

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.options, self._opened = state["url"], state["options"], None
        self._register()

    def __repr__(self) -> str:
        return f"StorageLocation({without_credentials(self.url)!r})"


def as_location(
    where: StorageLocation | str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> StorageLocation:
    """A location as given (its own options), or one made from a URL or path and ``storage_options``."""
    return where if isinstance(where, StorageLocation) else StorageLocation(where, storage_options)
