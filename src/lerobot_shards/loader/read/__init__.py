"""Reading: episode sources (converted shards, raw LeRobot v3.0), the node-wide shard cache,
remote reads with their timeouts, checksums of the bytes read, and the read-ahead thread."""
