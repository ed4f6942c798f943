"""A seeded shuffle buffer over a stream, with a bound on how far a sample may travel.

WebDataset's shuffle: fill a buffer from the stream, emit a random element, refill. Alone,
it lets a sample wait in the buffer indefinitely (each draw misses it with probability
``1 - 1/size``), so the samples waiting, and with them the shards a batch touches, can
span any stretch of the stream. Here a sample read at stream position ``q`` is emitted at
the latest when position ``q + window`` is read, so:

- **Locality**: the samples in the buffer (and the one being emitted) always lie within
  ``window + 1`` consecutive positions of the stream; with shards of ``n`` samples, within
  ``ceil(window / n) + 1`` shards.
- **Mixing**: the buffer is filled to ``hold = ceil(window / 2)`` samples before the first
  emission and stays at that size while the stream lasts; each emission is a uniform draw
  among them unless a sample reaches the window's end (about ``e**-2``, 14 %, of samples
  are emitted that way).
- **Exactness**: every element of the stream is emitted exactly once, in an order that is a
  pure function of the stream and the generator's seed.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["shuffle_within_window"]

T = TypeVar("T")


def shuffle_within_window(stream: Iterable[T], window: int, rng: random.Random) -> Iterator[T]:
    """The elements of ``stream``, shuffled within ``window`` positions (see the module)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    hold = -(-window // 2)
    # Slots: the buffered (position, item) pairs; emitted slots become None and are dropped
    # from the left of ``ages`` lazily, so finding the oldest buffered sample is O(1).
    slots: list[tuple[int, T]] = []
    ages: deque[int] = deque()  # positions in the buffer, oldest first (with stale ones)
    where: dict[int, int] = {}  # position -> index in slots
    position = 0

    def take(i: int) -> T:
        q, item = slots[i]
        last = slots.pop()
        if i < len(slots):
            slots[i] = last
            where[last[0]] = i
        del where[q]
        return item

    for item in stream:
        where[position] = len(slots)
        slots.append((position, item))
        ages.append(position)
        position += 1
        if len(slots) < hold:
            continue
        while ages[0] not in where:
            ages.popleft()
        if ages[0] <= position - 1 - window:
            # The oldest sample would leave the window with the next read: it goes now.
            yield take(where[ages.popleft()])
        else:
            yield take(rng.randrange(len(slots)))
    while slots:
        yield take(rng.randrange(len(slots)))
