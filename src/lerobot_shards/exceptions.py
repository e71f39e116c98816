"""The package's exception types: one base, ``LeRobotShardsError``, for everything it raises on purpose.

``except LeRobotShardsError`` catches any error lerobot-shards reports about a dataset, a shard, a
conversion or a resume state; each concrete type also keeps the built-in base it always had
(``ValueError``, ``RuntimeError``, ``OSError``), so existing ``except ValueError`` code still works.
The concrete types live beside the code that raises them (``format.FormatError``,
``loader.read.integrity.IntegrityError``, ...); ``ConvertError`` is here because every layer of the
converter raises it.
"""

from __future__ import annotations


class LeRobotShardsError(Exception):
    """Base of every exception lerobot-shards raises on purpose; the message names file, episode or field.

    Its text is redacted (``redaction.redact``) whenever it is shown: a message naming a URL with a
    password (``http://user:token@host/x``) or quoting a storage option must not print the secret,
    through the Python API (a traceback, a log line) as little as through the CLI.
    """

    def __str__(self) -> str:
        from .redaction import redact  # redaction imports nothing of ours; late, so either may load first

        return redact(super().__str__())


class ConvertError(LeRobotShardsError, RuntimeError):
    """An episode cannot be converted; the message names the episode and the file."""
