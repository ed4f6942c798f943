"""Tar shards in WebDataset's convention, the whole feature in one place: the format, its
index, the source that reads samples, the dataset, and the packer.

- :mod:`.tar`: tar headers and members from bytes, grouped into samples as ``webdataset``
  groups them;
- :mod:`.index`: a shard's index (``<shard>.idx``), or one built by scanning the shard;
- :mod:`.source`: :class:`~.source.ShardSource`, sample ``i`` as one ranged read of its
  shard, checked header by header against the index;
- :mod:`.dataset`: :class:`~concurrent_loader.ShardDataset`, random access by sample index;
- :mod:`.pack` (with :mod:`.packplan`, what is written and where, checked first):
  ``concurrent-loader pack``, objects or an ImageFolder into shards + indexes.

Floor: the datasets floor, beside :mod:`concurrent_loader.dataset` (``ShardDataset`` builds
on ``ObjectDataset``; the packer reads through it). This package may import every floor
below (sources, fetch, cache, stores, ...) and :mod:`concurrent_loader.dataset`; nothing
below the datasets floor imports it (``tests/test_layers.py`` holds the rule). Only the
package's exports and the command line import it. Importing this package imports none of
its modules: ``ShardDataset`` is exported from :mod:`concurrent_loader`.
"""
