"""Object keys stored once per node: a read-only memory-mapped file every process maps.

A :class:`KeyTable` holds its keys as one UTF-8 blob plus an offsets array, and beside them
optional integer columns (object sizes, class indices), all in one file (a *segment*) under
``/dev/shm`` (or the temporary directory when that has no room). Forked workers share its
pages (no Python object per key, so no page is copied by reference counting, PyTorch issue
#13246); ``spawn`` and ``forkserver`` workers receive only the segment's path when the table
is pickled and map the same pages. A key becomes a ``str`` only when it is read.

Lifetime. A segment's name carries its creator's pid namespace, pid and start time. The
creator unlinks it when the last dataset using the table releases it (:meth:`KeyTable.acquire`,
:meth:`KeyTable.release`), when the table is garbage collected, or at interpreter exit;
processes that mapped it keep their pages until they unmap them (the kernel frees them then).
A creator killed before any of these leaves its file behind: every new segment first removes
those of creators that are no longer alive (a live creator's, or one in another pid namespace
sharing ``/dev/shm``, are never touched).

The segment's file is also the binary manifest (:meth:`KeyTable.save`, :meth:`KeyTable.load`).
"""

from .manifest import parse_manifest_text, refused_key
from .segment import MAGIC, remove_stale_segments
from .table import KeyTable

__all__ = ["MAGIC", "KeyTable", "parse_manifest_text", "refused_key", "remove_stale_segments"]
