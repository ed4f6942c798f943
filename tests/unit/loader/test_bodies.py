"""The shared mapping of bodies (``loader/bodies.py``): a body counts only whole and of its
listed size, within the capacity, and a process forked before the writes sees them."""

from __future__ import annotations

import multiprocessing

from concurrent_loader.loader.bodies import ARRIVED, MISSED, PENDING, SharedBodies
from concurrent_loader.sources import Read


def reads(count: int, size: int | None = 4) -> list[Read]:
    return [Read(f"k{i}", size=size) for i in range(count)]


def test_a_body_is_there_once_put_and_not_before():
    first, second = reads(2)
    bodies = SharedBodies([first, second], 8)
    assert bodies.state(first) == PENDING and bodies.body(first) is None
    assert bodies.put(first, b"abcd")
    assert bodies.state(first) == ARRIVED and bodies.body(first) == b"abcd"
    assert bodies.state(second) == PENDING and not bodies.settled()
    bodies.settle(second, MISSED)
    assert bodies.body(second) is None and bodies.settled()


def test_a_body_beyond_the_capacity_or_of_another_size_is_not_kept():
    first, second, third = reads(3)
    bodies = SharedBodies([first, second, third], 8)
    assert not bodies.put(first, b"aa")  # listed as 4 bytes: changed since the listing
    assert bodies.state(first) == PENDING
    assert bodies.put(second, b"bbbb") and bodies.put(third, b"cccc")
    assert not bodies.put(first, b"aaaa")  # full
    assert (bodies.body(second), bodies.body(third)) == (b"bbbb", b"cccc")


def test_unlisted_sizes_are_packed_as_they_arrive():
    first, second = reads(2, size=None)
    bodies = SharedBodies([first, second], 5)
    assert bodies.put(first, b"xyz")
    assert not bodies.put(second, b"uvw")  # 6 bytes of 5
    assert bodies.put(second, b"uv")
    assert (bodies.body(first), bodies.body(second)) == (b"xyz", b"uv")


def test_a_read_listed_twice_has_one_place():
    (read,) = reads(1)
    assert SharedBodies([read, read], 4).reads == [read]


def _expect(bodies: SharedBodies, read: Read, body: bytes, written, checked) -> None:
    written.wait(30)
    checked.value = bodies.body(read) == body


def test_what_is_written_after_a_fork_is_seen_by_the_forked_process():
    first, second = reads(2)
    bodies = SharedBodies([first, second], 8)
    context = multiprocessing.get_context("fork")
    written, checked = context.Event(), context.Value("b", False)
    child = context.Process(target=_expect, args=(bodies, second, b"late", written, checked))
    child.start()
    assert bodies.put(second, b"late")
    written.set()
    child.join(30)
    assert child.exitcode == 0 and checked.value
    bodies.close()  # the parent's mapping goes; nothing of it is read here any more
    assert bodies.state(second) == MISSED and bodies.body(second) is None
