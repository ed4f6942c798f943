"""``python -m benchmarks.keys --smoke`` yields every figure and leaves no key table behind.

No figure is held to its goal here (a smoke run is far too small to show one); the full run's
figures are in ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import json
import math
import os

from _benchmark_run import run_benchmark

from benchmarks.keys import METHODS
from concurrent_loader.keys.segment import PREFIX, _directories, _start_time

RUN_TIMEOUT_S = 600


def _segments() -> set[str]:
    """The key tables whose creating process has ended (a live process's tables are its own:
    other tests or benchmarks may run beside this one)."""
    found = set()
    for directory in _directories():
        for name in os.listdir(directory):
            if name.startswith(PREFIX):
                _, pid, started = name[len(PREFIX) :].split("-")[:3]
                if _start_time(int(pid)) != started:
                    found.add(os.path.join(directory, name))
    return found


def test_the_smoke_run_measures_every_dataset_form_and_start_method(tmp_path):
    before = _segments()
    out = tmp_path / "keys.json"
    status, output = run_benchmark(
        "benchmarks.keys", ["--smoke", "--json", str(out)], RUN_TIMEOUT_S
    )
    assert status == 0, output[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["dataset"], r["form"]) for r in rows} == {
        (d, f) for d in ("object", "image-folder") for f in ("text", "binary")
    }
    for row in rows:
        assert row["keys"] == 20_000
        assert 0 < row["ready_s"] < 60 and row["raw_key_mib"] > 0
        assert math.isfinite(row["main_growth_x"])
        assert set(row["worker_mib"]) == set(METHODS)
        assert all(math.isfinite(v) for v in row["worker_mib"].values())
    assert _segments() <= before  # no table the run made outlives its processes
