"""The relay of bodies from the main process to forked workers (``loader/relay.py``), with
real forks: what a worker gets whether a body arrived before or after its fork, what it gets
for a read the main process missed, and that nobody waits once the fetch has ended."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from typing import Any

import pytest
from _forking import fork_warning

from concurrent_loader.loader.relay import WAIT_S, Relay
from concurrent_loader.sources import Read

pytestmark = fork_warning

BODIES = {f"k{i}": bytes([65 + i]) * (100 + i) for i in range(4)}


def reads(listed: bool = True) -> list[Read]:
    return [Read(key, None, len(body) if listed else None) for key, body in BODIES.items()]


def worker(relay: Relay, answer: Any) -> None:
    """A forked worker (number 0): every read's body, or None, and how long it took."""
    relay.attach(worker=0)
    slots = relay.slots()

    async def all_bodies() -> list[bytes | None]:
        return [await slots[read].body() for read in relay.reads]

    started = time.monotonic()
    found = asyncio.run(all_bodies())
    answer.send((found, time.monotonic() - started))


def forked(relay: Relay) -> tuple[Any, Any]:
    context = multiprocessing.get_context("fork")
    mine, theirs = context.Pipe(duplex=False)
    process = context.Process(target=worker, args=(relay, theirs))
    process.start()
    theirs.close()
    return process, mine


def answer_of(process: Any, answer: Any) -> tuple[list[bytes | None], float]:
    assert answer.poll(WAIT_S + 20), "the worker did not answer"
    found = answer.recv()
    process.join(10)
    assert process.exitcode == 0
    return found


def test_bodies_that_arrived_before_the_fork_are_taken_without_waiting():
    relay = Relay(reads(), workers=1, capacity=sum(map(len, BODIES.values())))
    for read in relay.reads:
        relay.deliver(read, BODIES[read.key])
    relay.end()  # every read ended before the workers start
    process, answer = forked(relay)
    relay.forked()
    found, _ = answer_of(process, answer)
    assert found == list(BODIES.values())


def test_bodies_that_arrive_after_the_fork_wake_the_worker():
    relay = Relay(reads(listed=False), workers=1, capacity=1 << 16)
    process, answer = forked(relay)
    relay.forked()
    time.sleep(0.2)  # the worker waits on its pipe meanwhile
    for read in relay.reads[:3]:
        relay.deliver(read, BODIES[read.key])
    relay.miss(relay.reads[3])
    relay.end()
    found, _ = answer_of(process, answer)
    assert found == [*list(BODIES.values())[:3], None]  # a miss is the worker's to fetch


def test_what_is_pending_at_the_end_is_the_workers_at_once():
    relay = Relay(reads(), workers=1, capacity=sum(map(len, BODIES.values())))
    relay.deliver(relay.reads[0], BODIES["k0"])
    process, answer = forked(relay)
    relay.forked()
    time.sleep(0.2)
    relay.end()  # the other three never arrived
    found, took = answer_of(process, answer)
    assert found == [BODIES["k0"], None, None, None]
    assert took < WAIT_S / 2  # woken by the end, not by its own time limit


def test_a_body_that_does_not_fit_or_differs_from_its_listing_is_missed():
    listed = reads()
    relay = Relay(listed, workers=1, capacity=len(BODIES["k0"]) + len(BODIES["k1"]))
    relay.deliver(listed[0], BODIES["k0"])
    relay.deliver(listed[1], BODIES["k1"][:-1])  # another size than listed
    relay.deliver(listed[2], BODIES["k2"])  # no room left
    relay.end()
    process, answer = forked(relay)
    relay.forked()
    found, _ = answer_of(process, answer)
    assert found == [BODIES["k0"], None, None, None]


def test_the_main_process_keeps_no_descriptor():
    before = set(os.listdir("/proc/self/fd"))
    relay = Relay(reads(), workers=3, capacity=1 << 16)
    assert len(set(os.listdir("/proc/self/fd")) - before) == 6  # a pipe per worker
    relay.forked()
    relay.end()
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_relay_never_ended_closes_its_descriptors_when_collected():
    before = set(os.listdir("/proc/self/fd"))
    relay = Relay(reads(), workers=2, capacity=1 << 16)
    del relay
    assert set(os.listdir("/proc/self/fd")) <= before


def many_waiters(relay: Relay, answer: Any) -> None:
    """A forked worker whose reads all wait at once, on a uvloop loop as the runtime's."""
    relay.attach(worker=0)
    slots = relay.slots()

    async def all_bodies() -> list[bytes | None]:
        return list(await asyncio.gather(*(slots[read].body() for read in relay.reads)))

    try:
        import uvloop

        found = uvloop.run(all_bodies())
    except ImportError:
        found = asyncio.run(all_bodies())
    answer.send(found)


@pytest.mark.parametrize("attempt", range(3))
def test_reads_waiting_together_all_get_their_bodies(attempt):
    # Each wake-up finds some states settled, and the read end is closed once none is pending.
    bodies = {f"w{i}": bytes([i]) * 64 for i in range(48)}
    listed = [Read(key, None, 64) for key in bodies]
    relay = Relay(listed, workers=1, capacity=64 * len(listed))
    context = multiprocessing.get_context("fork")
    mine, theirs = context.Pipe(duplex=False)
    process = context.Process(target=many_waiters, args=(relay, theirs))
    process.start()
    theirs.close()
    relay.forked()
    for number, read in enumerate(listed):
        relay.deliver(read, bodies[read.key])
        if number % (attempt + 2) == 0:
            time.sleep(0.0005)
    relay.end()
    assert mine.poll(WAIT_S + 20), "the worker did not answer"
    assert mine.recv() == list(bodies.values())
    process.join(10)
    assert process.exitcode == 0


def settled_while_watched(relay: Relay, steps: Any) -> None:
    """A forked worker: one read waits (its loop watches the pipe), every state is settled,
    and the worker finds that out from another read before its loop looks at the pipe."""
    relay.attach(worker=0)
    first = relay.slots()[relay.reads[0]]

    async def scenario() -> bytes | None:
        waiting = asyncio.ensure_future(first.body())
        await asyncio.sleep(0)  # it waits: the loop watches the pipe
        steps.send("waiting")
        steps.recv()  # the main process has settled every state
        relay._close_if_settled()  # what another read's wake-up does
        return await waiting

    try:
        import uvloop  # the runtime's loop: libuv aborts on a watched descriptor closed

        found = uvloop.run(scenario())
    except ImportError:
        found = asyncio.run(scenario())
    steps.send(found)


def test_the_read_end_is_never_closed_while_the_loop_watches_it():
    relay = Relay(reads(), workers=1, capacity=sum(map(len, BODIES.values())))
    context = multiprocessing.get_context("fork")
    mine, theirs = context.Pipe()
    process = context.Process(target=settled_while_watched, args=(relay, theirs))
    process.start()
    relay.forked()
    assert mine.poll(20) and mine.recv() == "waiting"
    for read in relay.reads:
        relay.deliver(read, BODIES[read.key])
    mine.send("settled")
    process.join(20)
    assert process.exitcode == 0  # not killed by SIGABRT
    assert mine.recv() == BODIES["k0"]
