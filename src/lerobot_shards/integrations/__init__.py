"""Bridges to other projects' tools, each imported only when its command runs (never by ``import lerobot_shards``)."""
