"""StallLedger: a consumer loop's time, waiting vs the rest, warm-up kept apart."""

from __future__ import annotations

import pytest

from concurrent_loader.metrics import StallLedger


def test_empty_ledger():
    ledger = StallLedger()
    assert ledger.steps == 0 and ledger.wait_share == 0.0
    assert ledger.wait_percentile(50) is None and ledger.step_percentile(50) is None


def test_wait_share_is_the_steady_states():
    ledger = StallLedger()
    ledger.record(5.0, 0.0, warmup=True)  # the pipeline filling up: not judged
    for wait, compute in [(0.1, 0.9), (0.3, 0.7), (0.0, 1.0), (0.4, 0.6)]:
        ledger.record(wait, compute, samples=8)
    assert ledger.steps == 4 and ledger.samples == 32
    assert ledger.warmup_steps == 1
    assert ledger.wait_s == pytest.approx(0.8) and ledger.compute_s == pytest.approx(3.2)
    assert ledger.wait_share == pytest.approx(0.2)


def test_percentiles_of_waits_and_steps():
    ledger = StallLedger()
    for i in range(1, 101):
        ledger.record(i / 1000, 1.0)
    assert ledger.wait_percentile(50) == pytest.approx(0.05)
    assert ledger.wait_percentile(99) == pytest.approx(0.099)
    assert ledger.step_percentile(100) == pytest.approx(1.1)


def test_warmup_steps_do_not_reach_the_percentiles():
    ledger = StallLedger()
    ledger.record(9.0, 0.0, samples=8, warmup=True)
    ledger.record(0.01, 0.1)
    assert ledger.wait_percentile(100) == 0.01
    assert ledger.samples == 0


def test_an_empty_ledger_has_no_wait_share():
    ledger = StallLedger()
    assert (ledger.steps, ledger.samples, ledger.warmup_steps) == (0, 0, 0)
    assert ledger.wait_share == 0.0
