"""The converter's error type, shared by every layer of it (tar sink, shard writer, run)."""


class ConvertError(RuntimeError):
    """An episode cannot be converted; the message names the episode and the file."""
