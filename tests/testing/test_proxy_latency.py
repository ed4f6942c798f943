"""The latency model: its pure, seeded draws, and the first bytes it holds back in a real
proxy process in front of the real local S3 server.

Time through the proxy is only bounded from below: the machine may be slow, never fast.
"""

from __future__ import annotations

import http.client
import statistics
import threading
import time

import pytest

from concurrent_loader.testing import FaultPlan, LatencyModel, ProxyProcess
from concurrent_loader.testing.proxy import LATENCY_PRESETS
from concurrent_loader.testing.proxy.cli import build_parser, proxy_from_args

from ._proxy_support import SMALL_KEYS, ProxyFactory, object_path, raw_get

S3_LIKE = LatencyModel(
    latency_p50_ms=30.0, latency_p99_ms=200.0, straggler_fraction=0.005, straggler_s=2.0
)
DRAWS = 20_000


def _delays(model: LatencyModel, seed: int = 0, method: str = "GET") -> list[float]:
    return [model.first_byte(seed, method, f"/b/k{i}", 0)[0] for i in range(DRAWS)]


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[int(q * len(values))]


# -- the draws, as pure functions --------------------------------------------------------------


@pytest.mark.parametrize(("p50_ms", "p99_ms"), [(30.0, 200.0), (5.0, 12.0), (100.0, 100.0)])
def test_lognormal_quantiles_land_on_the_configured_ones(p50_ms: float, p99_ms: float) -> None:
    delays = _delays(LatencyModel(latency_p50_ms=p50_ms, latency_p99_ms=p99_ms))
    # Standard errors at 20,000 draws are about 1 % (p50) and 2 % (p99) for the widest.
    assert _quantile(delays, 0.50) == pytest.approx(p50_ms / 1000, rel=0.05)
    assert _quantile(delays, 0.99) == pytest.approx(p99_ms / 1000, rel=0.10)
    assert min(delays) > 0


def test_latency_draws_are_a_function_of_seed_and_request() -> None:
    model = LatencyModel.from_options("s3-like")
    assert _delays(model, seed=5) == _delays(model, seed=5)
    assert _delays(model, seed=5) != _delays(model, seed=6)
    assert _delays(model, method="GET") != _delays(model, method="HEAD")
    # A retry of the same request (n = 1, 2, ...) gets a fresh draw.
    retries = {model.first_byte(5, "GET", "/b/k", n)[0] for n in range(50)}
    assert len(retries) == 50


def test_stragglers_are_the_configured_fraction_of_object_gets() -> None:
    base = LatencyModel(latency_p50_ms=30.0, latency_p99_ms=200.0)
    model = LatencyModel(
        latency_p50_ms=30.0, latency_p99_ms=200.0, straggler_fraction=0.05, straggler_s=3.0
    )
    draws = [model.first_byte(9, "GET", f"/b/k{i}", 0) for i in range(DRAWS)]
    flags = [straggler for _, straggler in draws]
    assert flags.count(True) / DRAWS == pytest.approx(0.05, abs=0.01)
    # A straggler waits exactly straggler_s more than the same request without stragglers;
    # the others are untouched (the two draws are independent).
    for i, (delay, straggler) in enumerate(draws):
        alone, _ = base.first_byte(9, "GET", f"/b/k{i}", 0)
        assert delay == pytest.approx(alone + (3.0 if straggler else 0.0))
    # Only object GETs straggle: not HEADs, PUTs or listings.
    always = LatencyModel(straggler_fraction=1.0, straggler_s=1.0)
    assert always.first_byte(0, "GET", "/b/k?versionId=2", 0) == (1.0, True)
    for method, target in [("HEAD", "/b/k"), ("PUT", "/b/k"), ("GET", "/b"), ("GET", "/b/")]:
        assert always.first_byte(0, method, target, 0) == (0.0, False)


def test_fixed_latency_and_jitter_draw_what_they_always_drew() -> None:
    model = LatencyModel(latency_ms=100, jitter_ms=50)
    # Pinned from the proxy before the latency model existed: seeded runs stay comparable.
    assert model.first_byte(7, "GET", "/b/k0", 0) == (0.10270989576132322, False)
    assert model.first_byte(7, "GET", "/b/k0", 1) == (0.13005973064851717, False)
    assert model.first_byte(7, "GET", "/b/other?versionId=3", 0)[0] == 0.0630846552711226
    delays = _delays(model)
    assert min(delays) >= 0.05 and max(delays) <= 0.15
    assert statistics.fmean(delays) == pytest.approx(0.1, abs=0.002)
    assert LatencyModel(latency_ms=40).first_byte(3, "GET", "/b/k", 0) == (0.04, False)


# -- options, presets and validation --------------------------------------------------------


def test_presets_and_explicit_options() -> None:
    assert LATENCY_PRESETS["s3-like"] == S3_LIKE
    assert LatencyModel.from_options("s3-like") == S3_LIKE
    assert LatencyModel.from_options() == LatencyModel()
    overridden = LatencyModel.from_options("s3-like", latency_p99_ms=300, straggler_fraction=0)
    assert (overridden.latency_p50_ms, overridden.latency_p99_ms) == (30.0, 300)
    assert overridden.straggler_fraction == 0
    # Options left at None keep the preset's value.
    assert LatencyModel.from_options("s3-like", straggler_s=None) == S3_LIKE
    with pytest.raises(ValueError, match="unknown preset"):
        LatencyModel.from_options("s3-ish")


def test_process_and_cli_resolve_the_same_model() -> None:
    proxy = ProxyProcess("http://127.0.0.1:1", preset="s3-like", straggler_s=0.5)
    expected = LatencyModel.from_options("s3-like", straggler_s=0.5)
    assert proxy.latency == expected
    # The command line carries the resolved model, flag by flag.
    command = proxy.command()
    args = build_parser().parse_args(command[command.index("--exit-on-stdin-eof") :])
    assert proxy_from_args(args).latency == expected
    cli = ["--upstream", "http://127.0.0.1:1", "--preset", "s3-like", "--straggler-s", "0.5"]
    assert proxy_from_args(build_parser().parse_args(cli)).latency == expected
    plain = proxy_from_args(build_parser().parse_args([*cli[:2], "--latency-ms", "40"]))
    assert plain.latency == LatencyModel(latency_ms=40)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"latency_ms": -5},
        {"jitter_ms": float("inf")},
        {"latency_p50_ms": 30},
        {"latency_p99_ms": 200},
        {"latency_p50_ms": 0, "latency_p99_ms": 10},
        {"latency_p50_ms": 50, "latency_p99_ms": 40},
        {"latency_p50_ms": 30, "latency_p99_ms": 200, "latency_ms": 10},
        {"preset": "s3-like", "jitter_ms": 10},
        {"preset": "s3-like", "latency_p50_ms": 500},
        {"straggler_fraction": 1.5},
        {"straggler_fraction": -0.1},
        {"straggler_s": -1},
        {"preset": "nope"},
    ],
)
def test_bad_latency_options_are_refused_before_anything_starts(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", **kwargs)


# -- through a real proxy -------------------------------------------------------------------


def test_latency_holds_the_first_byte(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=150)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        for _ in range(2):  # the second one reuses the kept-alive connection
            start = time.monotonic()
            conn.request("GET", object_path(s3_bucket, SMALL_KEYS[0]))
            response = conn.getresponse()
            first_byte = time.monotonic() - start
            assert response.read() == objects[SMALL_KEYS[0]]
            assert first_byte >= 0.15
    finally:
        conn.close()


def test_jitter_keeps_latency_within_bounds(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    proxy = proxy_factory(latency_ms=100, jitter_ms=50)
    for key in SMALL_KEYS[:4]:
        start = time.monotonic()
        response = raw_get(proxy, object_path(s3_bucket, key))
        assert time.monotonic() - start >= 0.05
        assert response.body == objects[key]


def test_s3_like_preset_delays_the_predicted_stragglers(
    proxy_factory: ProxyFactory, s3_bucket: str, objects: dict
) -> None:
    seed = 3
    # Half the GETs straggle (the preset's 0.5 % would need hundreds of requests).
    proxy = proxy_factory(preset="s3-like", straggler_fraction=0.5, faults=FaultPlan(seed=seed))
    paths = [object_path(s3_bucket, key) for key in SMALL_KEYS]
    predicted = {path: proxy.latency.first_byte(seed, "GET", path, 0) for path in paths}
    stragglers = [path for path in paths if predicted[path][1]]
    assert 0 < len(stragglers) < len(paths)  # the seed gives both kinds

    barrier = threading.Barrier(len(paths))
    took: dict[str, float] = {}
    bodies: dict[str, bytes] = {}

    def fetch(path: str) -> None:
        barrier.wait()
        start = time.monotonic()
        bodies[path] = raw_get(proxy, path).body
        took[path] = time.monotonic() - start

    threads = [threading.Thread(target=fetch, args=(path,)) for path in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert bodies == {object_path(s3_bucket, key): objects[key] for key in SMALL_KEYS}
    # Every GET waited at least what the model drew for it (less the event loop's timer
    # granularity, a millisecond), and every straggler the preset's 2 s more.
    for path in paths:
        assert took[path] >= predicted[path][0] - 0.002
    for path in stragglers:
        assert took[path] >= 2.0
    assert proxy.stats()["stragglers"] == len(stragglers)
