"""The plan: pure functions of metadata, seed, epoch, rank and worker (no I/O, no torch).

Which shards each consumer reads (``partition``), the order it emits frames in (``sampling``),
``delta_timestamps`` windows (``windows``), how far a resumed epoch skips (``resume``, ``elastic``)
and the resume state that fixes an epoch's order (``order``). Nothing here imports the loader's
reading, decoding, transport or mixing packages.
"""
