"""Decoding at emit time: torchcodec decoders per clip, on CPU threads or the rank's GPU."""
