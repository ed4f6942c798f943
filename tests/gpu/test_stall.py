from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from concurrent_loader.errors import ConfigError
from concurrent_loader.gpu import StallComparison, StallMeter, StallReport, measure_stalls


class Clock:
    """A clock the test moves by hand, so timings are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def slow_source(clock: Clock, waits: list[float], batch: int = 8) -> Iterator[torch.Tensor]:
    for wait in waits:
        clock.now += wait
        yield torch.zeros(batch, 3)


def test_splits_each_step_into_wait_and_compute() -> None:
    clock = Clock()
    meter = StallMeter(clock=clock)
    computes = [1.0, 2.0, 3.0, 4.0]
    for batch, compute in zip(
        meter.iterate(slow_source(clock, [0.5, 1.0, 0.0, 2.5])), computes, strict=True
    ):
        assert batch.shape == (8, 3)
        clock.now += compute
    report = meter.report()
    assert report.steps == 4
    assert report.samples == 32
    assert report.wait_s == pytest.approx(4.0)
    assert report.compute_s == pytest.approx(10.0)
    assert report.stall_share == pytest.approx(4.0 / 14.0)
    assert report.samples_per_s == pytest.approx(32 / 14.0)
    # step times 1.5, 3.0, 3.0, 6.5: nearest-rank p50 is the 2nd, p95 the 4th
    assert report.step_p50_s == pytest.approx(3.0)
    assert report.step_p95_s == pytest.approx(6.5)
    assert report.mean_wait_s == pytest.approx(1.0)
    assert report.mean_compute_s == pytest.approx(2.5)
    assert "data stall 28.6%" in str(report)


def test_warmup_steps_are_left_out() -> None:
    clock = Clock()
    meter = StallMeter(clock=clock, warmup_steps=2)
    for _ in meter.iterate(slow_source(clock, [10.0, 10.0, 1.0, 1.0])):
        clock.now += 1.0
    report = meter.report()
    assert report.steps == 2
    assert report.wait_s == pytest.approx(2.0)


def test_samples_per_batch_can_be_given() -> None:
    clock = Clock()
    meter = StallMeter(clock=clock, samples_per_batch=lambda batch: 5)
    for _ in meter.iterate([{"x": 1}, {"x": 2}]):
        clock.now += 1.0
    assert meter.report().samples == 10


def test_default_sample_count_uses_the_first_tensor() -> None:
    meter = StallMeter()
    for _ in meter.iterate([("name", {"image": torch.zeros(6, 2)}), "no tensor", torch.tensor(1)]):
        pass
    assert meter.report().samples == 6 + 1 + 1


def test_max_steps_stops_without_pulling_an_extra_batch() -> None:
    pulled = []

    def source() -> Iterator[torch.Tensor]:
        for i in range(10):
            pulled.append(i)
            yield torch.zeros(1)

    meter = StallMeter()
    assert len(list(meter.iterate(source(), max_steps=3))) == 3
    assert pulled == [0, 1, 2]
    assert meter.report().steps == 3


def test_a_step_cut_short_by_break_is_not_recorded() -> None:
    clock = Clock()
    meter = StallMeter(clock=clock)
    for i, _ in enumerate(meter.iterate(slow_source(clock, [1.0] * 5))):
        clock.now += 1.0
        if i == 2:
            break
    assert meter.report().steps == 2


def test_closes_the_iterator_it_made_but_not_one_passed_in() -> None:
    closed = []

    class Source:
        def __iter__(self) -> Iterator[int]:
            try:
                yield from range(10)
            finally:
                closed.append(True)

    meter = StallMeter()
    for _ in meter.iterate(Source(), max_steps=2):
        pass
    assert closed == [True]
    passed = iter(Source())
    for _ in meter.iterate(passed, max_steps=2):
        pass
    assert closed == [True]
    assert next(passed) == 2  # still usable by its owner
    passed.close()  # type: ignore[attr-defined]


def test_empty_report() -> None:
    meter = StallMeter()
    report = meter.report()
    assert report.steps == 0 and report.samples == 0
    assert math.isnan(report.stall_share) and math.isnan(report.step_p50_s)


def test_invalid_arguments() -> None:
    with pytest.raises(ConfigError):
        StallMeter(warmup_steps=-1)
    with pytest.raises(ConfigError):
        measure_stalls(lambda b: None, [torch.zeros(1)], steps=0)
    with pytest.raises(ConfigError, match="no batch"):
        measure_stalls(lambda b: None, [], steps=1)


def test_measure_stalls_compares_loader_fed_with_synthetic_rate() -> None:
    clock = Clock()
    seen: list[torch.Tensor] = []

    def train_step(batch: torch.Tensor) -> None:
        seen.append(batch)
        clock.now += 1.0

    comparison = measure_stalls(
        train_step, slow_source(clock, [3.0] * 100), steps=10, warmup_steps=2, clock=clock
    )
    assert comparison.loader.steps == 10
    assert comparison.synthetic.steps == 10
    # 12 loader-fed steps, then the first batch replayed 12 times
    assert len(seen) == 24
    assert all(batch is seen[0] for batch in seen[12:])
    assert comparison.loader.stall_share == pytest.approx(0.75)
    assert comparison.synthetic.stall_share == pytest.approx(0.0)
    assert comparison.rate_ratio == pytest.approx(0.25)
    assert "loader-fed rate / synthetic rate: 0.250 (differential data stall 75.0%)" in str(
        comparison
    )


def test_measure_stalls_with_a_short_source_replays_as_many_steps() -> None:
    comparison = measure_stalls(lambda b: None, [torch.zeros(4)] * 3, steps=10, warmup_steps=1)
    assert comparison.loader.steps == 2
    assert comparison.synthetic.steps == 2


def test_ratio_is_nan_without_synthetic_rate() -> None:
    empty = StallReport(0, 0, 0.0, 0.0, math.nan, math.nan)
    assert math.isnan(StallComparison(loader=empty, synthetic=empty).rate_ratio)
