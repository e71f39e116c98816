"""Mixing several datasets by weight: the mixture file, the order of an epoch's sources, the
shared key layout and stats, and ``MixtureDataset`` built on one ``EpisodePoolDataset`` per source."""
