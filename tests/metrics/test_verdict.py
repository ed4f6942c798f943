"""The bottleneck verdict, as a table: each branch, and the edges between them."""

from __future__ import annotations

import pytest

from concurrent_loader.metrics import verdict


@pytest.mark.parametrize(
    ("wait_share", "fetch_busy", "decode_busy", "starts", "advice"),
    [
        # the loop hardly waits: whatever the stages do, the training step is the limit
        (0.0, 0.0, 0.0, "training step", "keeps up"),
        (0.099, 1.0, 1.0, "training step", "keeps up"),
        # the loop waits, yet neither stage is busy: not enough work is asked for
        (0.1, 0.0, 0.0, "loader", "prefetch_batches"),
        (0.5, 0.49, 0.49, "loader", "prefetch_batches"),
        # the busier stage is the bottleneck; a tie goes to storage
        (0.5, 0.5, 0.2, "storage", "max_inflight_requests"),
        (0.9, 0.95, 0.95, "storage", "max_inflight_requests"),
        (0.5, 0.2, 0.5, "decode", "decode_threads"),
        (0.9, 0.7, 0.71, "decode", "image_size"),
    ],
)
def test_verdict(wait_share, fetch_busy, decode_busy, starts, advice):
    line = verdict(wait_share=wait_share, fetch_busy=fetch_busy, decode_busy=decode_busy)
    assert line.startswith(starts + ":")
    assert advice in line


def test_verdict_quotes_the_shares():
    line = verdict(wait_share=0.42, fetch_busy=0.9, decode_busy=0.3)
    assert "42%" in line and "90%" in line


@pytest.mark.parametrize(
    ("fetch_busy", "decode_busy", "starts", "advice"),
    [
        (0.2, 0.2, "remote prep", "max_batches_in_flight"),
        (0.9, 0.3, "storage", "RayExecutor(actors=...) (now 3)"),
        (0.3, 0.9, "decode on the 3 Ray actors", "RayExecutor(actors=...) (now 3)"),
    ],
)
def test_with_ray_actors_the_verdict_names_remote_prep(fetch_busy, decode_busy, starts, advice):
    line = verdict(wait_share=0.5, fetch_busy=fetch_busy, decode_busy=decode_busy, actors=3)
    assert line.startswith(starts + ":")
    assert advice in line and "num_workers" not in line
