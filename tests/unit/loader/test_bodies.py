"""The shared mapping of bodies (``loader/bodies.py``): a body counts only whole and of its
listed size, each writer within its own region, and a process forked before the writes
sees them."""

from __future__ import annotations

import multiprocessing

from concurrent_loader.loader.bodies import ARRIVED, MISSED, PENDING, SharedBodies
from concurrent_loader.sources import Read


def reads(count: int, size: int | None = 4) -> list[Read]:
    return [Read(f"k{i}", size=size) for i in range(count)]


def test_a_body_is_there_once_put_and_not_before():
    first, second = reads(2)
    bodies = SharedBodies([first, second], [8])
    assert bodies.state(first) == PENDING and bodies.body(first) is None
    assert bodies.put(first, b"abcd")
    assert bodies.state(first) == ARRIVED and bodies.body(first) == b"abcd"
    assert bodies.state(second) == PENDING and not bodies.settled()
    bodies.settle(second, MISSED)
    assert bodies.body(second) is None and bodies.settled()


def test_a_body_beyond_its_region_or_of_another_size_is_not_kept():
    first, second, third = reads(3)
    bodies = SharedBodies([first, second, third], [4, 4])
    assert bodies.put(first, b"aaaa", region=0)
    assert not bodies.put(second, b"bbbb", region=0)  # region 0 is full
    assert bodies.state(second) == PENDING
    assert not bodies.put(third, b"cc", region=1)  # listed as 4 bytes: changed since
    assert bodies.put(second, b"bbbb", region=1)
    assert bodies.body(first) == b"aaaa" and bodies.body(second) == b"bbbb"


def test_unlisted_sizes_are_packed_as_they_arrive():
    first, second = reads(2, size=None)
    bodies = SharedBodies([first, second], [5])
    assert bodies.put(first, b"xyz")
    assert not bodies.put(second, b"uvw")  # 6 bytes in a region of 5
    assert bodies.put(second, b"uv")
    assert (bodies.body(first), bodies.body(second)) == (b"xyz", b"uv")


def test_a_read_listed_twice_has_one_place():
    (read,) = reads(1)
    bodies = SharedBodies([read, read], [4])
    assert bodies.reads == [read]


def _write(bodies: SharedBodies, read: Read, body: bytes, region: int) -> None:
    assert bodies.put(read, body, region)


def test_what_a_forked_process_writes_is_seen_by_its_parent():
    first, second = reads(2)
    bodies = SharedBodies([first, second], [4, 4])
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_write, args=(bodies, second, b"from", 1))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert bodies.body(second) == b"from" and bodies.state(first) == PENDING
    bodies.close()
    assert bodies.state(second) == MISSED and bodies.body(second) is None
