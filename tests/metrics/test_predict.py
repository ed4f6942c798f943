"""The data-stall model of ``analyze`` (``metrics/predict.py``), on scripted stage rates: each
figure is computed here by hand from the formula its module docstring states."""

from __future__ import annotations

import math

import pytest

from concurrent_loader.metrics.predict import (
    INFLIGHT_HEADROOM,
    MIN_INFLIGHT,
    Setting,
    StageRates,
    cache_share_needed,
    interpolate,
    recommend,
    stall_share,
)

# One process: 100 obj/s at 10 in flight (0.1 s per GET), 400 at 40, the storage flat at 600
# from 100 in flight; decode 200/s on one thread, 400/s on two, 700/s on four; 4 cores.
INGEST = {10: 100.0, 40: 400.0, 100: 600.0}
DECODE = {1: 200.0, 2: 400.0, 4: 700.0}


def rates(**changes: object) -> StageRates:
    fields: dict[str, object] = {
        "ingest": INGEST,
        "decode": DECODE,
        "cpus": 4,
        "sample_bytes": 1000.0,
    }
    fields.update(changes)
    return StageRates(**fields)  # type: ignore[arg-type]


def test_interpolation_is_linear_from_zero_and_flat_past_the_last_point():
    assert interpolate(INGEST, 5) == pytest.approx(50.0)
    assert interpolate(INGEST, 25) == pytest.approx(250.0)
    assert interpolate(INGEST, 70) == pytest.approx(500.0)
    assert interpolate(INGEST, 1000) == 600.0


@pytest.mark.parametrize(
    ("loader", "step", "share"), [(300.0, 400.0, 0.25), (400.0, 400.0, 0.0), (500.0, 400.0, 0.0)]
)
def test_the_stall_share_is_what_the_loader_lacks_of_the_step_rate(loader, step, share):
    assert stall_share(loader, step) == pytest.approx(share)


def test_a_step_rate_must_be_positive():
    with pytest.raises(ValueError, match="step rate"):
        stall_share(100.0, 0.0)


def test_the_loader_rate_is_the_slower_stage_times_the_efficiency():
    model = rates(efficiency={(1, 1): 0.8})
    # 2 workers x 1 thread, 20 in flight each: ingest at 40 = 400; decode 2 x 200 = 400
    assert model.loader_rate(Setting(2, 1, 20)) == pytest.approx(0.8 * 400.0)
    # 1 worker x 2 threads, 5 in flight: ingest at 5 = 50 < decode 400
    assert model.loader_rate(Setting(1, 2, 5)) == pytest.approx(0.8 * 50.0)
    assert model.bottleneck(Setting(1, 2, 5)) == "storage"
    # decoders are cores: 3 x 1 between 2 and 4 threads; 4 x 2 flat past the 4 cores
    assert model.decode_at(Setting(3, 1, 64)) == pytest.approx(550.0)
    assert model.decode_at(Setting(4, 2, 64)) == pytest.approx(700.0)
    assert model.bottleneck(Setting(2, 1, 64)) == "decode"  # ingest at 128: 600 > 400


def test_a_cache_share_mixes_hit_and_miss_times():
    model = rates(cache_rate=2000.0)
    setting = Setting(1, 1, 10)  # ingest 100/s
    assert model.ingest_at(setting, 0.5) == pytest.approx(1 / (0.5 / 100 + 0.5 / 2000))
    assert math.isinf(rates().ingest_at(setting, 1.0))  # hits not measured: free


def test_the_cache_share_needed_reaches_the_target_ingest():
    share = cache_share_needed(100.0, 300.0, 2000.0)
    assert 1 / ((1 - share) / 100 + share / 2000) == pytest.approx(300.0)
    assert cache_share_needed(400.0, 300.0, None) == 0.0
    assert math.isinf(cache_share_needed(100.0, 300.0, 50.0))  # hits slower than misses


def test_efficiency_is_the_measured_share_of_the_model_per_setting_at_most_one():
    model = rates()
    measured = [
        (Setting(1, 1, 64), 100.0),  # model 200 -> 0.5
        (Setting(1, 1, 64), 140.0),  # again -> 0.7: the median, 0.6
        (Setting(1, 2, 64), 360.0),  # model 400 -> 0.9
        (Setting(1, 4, 64), 420.0),  # model 480 (ingest at 64 in flight) -> 0.875
        (Setting(2, 1, 64), 300.0),  # model 400 -> 0.75
        (Setting(4, 1, 64), 720.0),  # model 600 -> 1.2, at most 1
    ]
    fitted = model.with_efficiency(measured)
    assert fitted.efficiency == pytest.approx(
        {(1, 1): 0.6, (1, 2): 0.9, (1, 4): 0.875, (2, 1): 0.75, (4, 1): 1.0}
    )
    assert fitted.loader_rate(Setting(2, 1, 20)) == pytest.approx(0.75 * 400.0)
    # not measured: the median of the nearest worker count's (the larger on a tie)
    assert fitted.efficiency_at(Setting(3, 1, 64)) == 1.0
    assert fitted.efficiency_at(Setting(2, 2, 64)) == pytest.approx(0.75)
    assert fitted.efficiency_at(Setting(1, 3, 64)) == pytest.approx(0.875)
    assert fitted.efficiency_at(Setting(0, 1, 64)) == pytest.approx(0.6)  # the main process
    assert rates().efficiency_at(Setting(2, 1, 64)) == 1.0  # nothing fitted


def test_the_rate_predicted_for_a_setting_is_at_its_workers_efficiency():
    # Two workers lose a quarter where one worker of two threads loses nothing: at the same
    # stage rates the one worker is predicted faster, and recommended for a step of 350/s.
    fitted = rates(efficiency={(1, 2): 1.0, (2, 1): 0.75})
    rec = recommend(fitted, step_rate=350.0, dataset_bytes=10**6)
    assert (rec.setting.workers, rec.setting.decode_threads) == (1, 2)
    assert rec.rate == pytest.approx(400.0) and rec.stall == 0.0


def test_requests_in_flight_are_where_the_ingest_curve_reaches_the_rate():
    assert rates().latency_s == pytest.approx(0.1)  # Little's law at 10 in flight
    # 500/s: halfway from 400 at 40 to 600 at 100 = 70 in flight, x headroom, per worker
    assert rates().inflight_for(500.0, 2) == math.ceil(INFLIGHT_HEADROOM * 70 / 2)
    # past the ceiling: where the curve reaches it
    assert rates().inflight_for(900.0, 1) == math.ceil(INFLIGHT_HEADROOM * 100)
    assert rates().inflight_for(1.0, 4) == MIN_INFLIGHT


def test_without_a_step_the_fastest_setting_on_the_fewest_cores_is_recommended():
    rec = recommend(rates(), dataset_bytes=10**6)
    # 3 cores decode 550; 4 (4 x 1, 2 x 2, 1 x 4) get the storage's 600: most workers first
    assert (rec.setting.workers, rec.setting.decode_threads) == (4, 1)
    assert rec.stall is None
    # decode 700 > the storage's 600: a cache holding 1 - 600/700 of the data closes the gap
    assert rec.cache_share == pytest.approx(cache_share_needed(600.0, 700.0, None))
    assert rec.cache_share == pytest.approx(1 - 600 / 700)
    assert rec.cache_budget_bytes == math.ceil(rec.cache_share * 10**6)
    assert rec.rate == pytest.approx(700.0)
    assert rec.bottleneck == "decode"


def test_with_a_step_rate_the_fewest_cores_that_reach_it_are_recommended():
    rec = recommend(rates(), step_rate=350.0, dataset_bytes=10**6)
    # 2 cores decode 400 >= 350 (2 x 1 before 1 x 2)
    assert (rec.setting.workers, rec.setting.decode_threads) == (2, 1)
    assert rec.stall == 0.0
    # 350/s: from 100 at 10 to 400 at 40, at 35 in flight; with headroom, over 2 workers
    assert rec.setting.inflight == math.ceil(INFLIGHT_HEADROOM * 35 / 2)
    assert rec.cache_budget_bytes == 0


def test_a_step_no_setting_reaches_gets_the_fastest_and_its_stall():
    rec = recommend(rates(efficiency={(1, 1): 0.5}), step_rate=600.0, dataset_bytes=10**6)
    assert rec.rate == pytest.approx(0.5 * 700)  # 4 cores' decode, the cache making up
    assert rec.stall == pytest.approx(1 - 350 / 600)


def test_a_storage_bound_setting_gets_the_cache_budget_that_lifts_its_ingest():
    slow = {10: 20.0, 100: 50.0}  # the storage tops out at 50/s
    rec = recommend(rates(ingest=slow), step_rate=200.0, dataset_bytes=10**6)
    assert (rec.setting.workers, rec.setting.decode_threads) == (1, 1)  # decode 200 reaches it
    share = cache_share_needed(50.0, 200.0, None)
    assert rec.cache_share == pytest.approx(share)
    assert rec.cache_budget_bytes == math.ceil(share * 10**6)
    assert rec.rate == pytest.approx(200.0)
    assert rec.stall == pytest.approx(0.0)


def test_a_local_root_gets_no_cache():
    rec = recommend(rates(ingest={4: 50.0}), step_rate=200.0, dataset_bytes=10**6, remote=False)
    assert rec.cache_budget_bytes == 0
    assert rec.bottleneck == "storage"


@pytest.mark.parametrize(
    "bad", [{"ingest": {}}, {"decode": {0: 5.0}}, {"decode": {1: math.nan}}, {"cpus": 0}]
)
def test_rates_that_cannot_be_used_are_refused(bad):
    with pytest.raises(ValueError):
        rates(**bad)
