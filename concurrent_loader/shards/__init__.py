"""Tar shards in WebDataset's convention: the format, its index, and the packer.

- :mod:`.tar`: tar headers and members from bytes, grouped into samples as ``webdataset``
  groups them;
- :mod:`.index`: a shard's index (``<shard>.idx``), or one built by scanning the shard;
- :mod:`.pack`: ``concurrent-loader pack``, objects or an ImageFolder into shards + indexes;
- :mod:`.dataset`: :class:`~concurrent_loader.ShardDataset`, random access by sample index
  (its reads: :mod:`concurrent_loader.sources.shards`).

``ShardDataset`` is exported from :mod:`concurrent_loader`; this package does not import
it, so the sources layer can use the format without a cycle.
"""
