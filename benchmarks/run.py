"""The benchmark driver: ``python -m benchmarks [options]`` from the repository root.

It answers two questions with one command: how close to local disk does a dataset in
S3-compatible storage train through ``ConcurrentDataLoader``, and how much faster is that
than what users run today (a stock ``DataLoader`` over boto3) and than the peers.

Flow: generate (or reuse) the dataset on local disk; start the local S3 server and upload
it (or reuse the upload); start a proxy that delays each response's first byte by
``--latency-ms``; then measure every configuration ``--repeats`` times, each run in a fresh
subprocess pinned to the client CPUs while the server and proxy are pinned to the storage
CPUs; then the latency and ``max_inflight_requests`` sweeps and the fetch-only section.
Figures go to the terminal, to ``<out>/results.json`` and ``<out>/results.png``; with
``--write-results`` also to ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.configs import CONFIGS, LoaderParams, unavailable_reason
from benchmarks.data import DatasetSpec, ensure_local, ensure_uploaded, list_keys
from benchmarks.fetch_only import CLIENTS
from benchmarks.fetch_only import unavailable_reason as fetch_unavailable_reason

REPO_ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
#: the sweep's value for the self-tuned default (``max_inflight_requests=None``)
SELF_TUNED = 0

# --smoke: a tiny run that keeps the harness working in CI; figures from it mean nothing.
SMOKE = {
    "images": 256,
    "batch_size": 32,
    "repeats": 1,
    "warmup_batches": 1,
    "run_images": 64,
    "latency_sweep": "",  # empty: --latency-ms only
    "inflight_sweep": "8",
    "fetch_concurrency": "1,16",
    "fetch_rounds": 4,
    "fetch_min_requests": 16,
}


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _cpu_set(text: str) -> list[int]:
    """Parse ``0``, ``0,2`` or ``0-3`` style CPU lists."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def _bytes_per_s(text: str) -> float:
    """``12500000``, ``100M`` or ``1.5G`` (bytes per second, decimal units)."""
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    text = text.strip().lower().removesuffix("b/s").removesuffix("/s")
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        allow_abbrev=False,
        description=(
            "Measure ConcurrentDataLoader over S3-compatible storage against local disk, "
            "a stock DataLoader + boto3, and peer loaders, on one machine."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("dataset")
    g.add_argument("--images", type=int, default=2000, help="images in the dataset")
    g.add_argument("--classes", type=int, default=10, help="class directories")
    g.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".bench/data", help="dataset cache")
    g.add_argument("--s3-dir", type=Path, default=REPO_ROOT / ".bench/s3", help="S3 server storage")

    g = p.add_argument_group("loading")
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers for every configuration (default: one per client CPU)",
    )
    g.add_argument("--image-size", type=int, default=224, help="decoded output side")
    g.add_argument("--max-inflight-requests", type=int, default=64, help="ours, per worker")
    g.add_argument("--seed", type=int, default=0, help="shuffle seed")
    g.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated configurations: " + ", ".join(CONFIGS),
    )

    g = p.add_argument_group("measurement")
    g.add_argument("--repeats", type=int, default=3, help="runs per configuration")
    g.add_argument(
        "--warmup-batches",
        type=int,
        default=2,
        help="batches before the window, at least; a loader that buffers more batches ahead "
        "of the consumer is first drained of them all",
    )
    g.add_argument(
        "--run-images",
        type=int,
        default=384,
        help="images in each measured window (fewer if the epoch ends first)",
    )
    g.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")

    g = p.add_argument_group("storage emulation")
    g.add_argument("--latency-ms", type=float, default=50.0, help="first-byte delay per GET")
    g.add_argument("--jitter-ms", type=float, default=0.0, help="random extra first-byte delay")
    g.add_argument(
        "--bandwidth",
        type=_bytes_per_s,
        default=None,
        help="per-connection bandwidth cap in bytes/s (e.g. 100M); default: none",
    )
    g.add_argument(
        "--storage-cpus",
        type=_cpu_set,
        default=None,
        help="CPUs for the S3 server and proxy (default: the last CPU)",
    )
    g.add_argument(
        "--client-cpus",
        type=_cpu_set,
        default=None,
        help="CPUs for the loader under test and its workers (default: all others)",
    )

    g = p.add_argument_group("sweeps")
    g.add_argument(
        "--latency-sweep",
        default="0,20,50,100",
        help="latencies (ms) for ours over S3; empty: --latency-ms only",
    )
    g.add_argument(
        "--inflight-sweep",
        default="auto,1,8,32,64,128",
        help="max_inflight_requests values for ours over S3 at --latency-ms; auto: the "
        "self-tuned default (its row reads 0)",
    )
    g.add_argument("--sweep-repeats", type=int, default=1, help="runs per sweep point")

    g = p.add_argument_group("fetch-only")
    g.add_argument("--fetch-only", action="store_true", help="run only the fetch-only section")
    g.add_argument("--no-fetch", action="store_true", help="skip the fetch-only section")
    g.add_argument("--fetch-clients", default=",".join(CLIENTS))
    g.add_argument("--fetch-concurrency", default="1,16,64,256")
    g.add_argument("--fetch-rounds", type=int, default=20, help="GETs per lane per window")
    g.add_argument("--fetch-min-requests", type=int, default=100, help="GETs per window, min")
    g.add_argument(
        "--fetch-latency-ms",
        type=float,
        default=None,
        help="first-byte latency for the fetch-only section (default: --latency-ms)",
    )

    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/out")
    g.add_argument("--write-results", action="store_true", help="also render benchmarks/RESULTS.md")
    g.add_argument("--smoke", action="store_true", help="tiny CI run: " + json.dumps(SMOKE))
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if "--smoke" in given:
        # Smoke values replace the defaults, not what was given explicitly.
        parser.set_defaults(**SMOKE)
    args = parser.parse_args(given)

    all_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    if args.storage_cpus is None:
        args.storage_cpus = all_cpus[-1:]
    if args.client_cpus is None:
        args.client_cpus = [c for c in all_cpus if c not in args.storage_cpus] or all_cpus
    if args.workers is None:
        args.workers = len(args.client_cpus)
    if args.fetch_latency_ms is None:
        args.fetch_latency_ms = args.latency_ms

    # Absolute now: the S3 server runs in a directory of its own.
    args.data_dir, args.s3_dir, args.out = (
        p.resolve() for p in (args.data_dir, args.s3_dir, args.out)
    )
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for name in args.configs:
        if name not in CONFIGS:
            parser.error(f"unknown configuration {name!r}; choose from {', '.join(CONFIGS)}")
    args.fetch_clients = [c.strip() for c in args.fetch_clients.split(",") if c.strip()]
    for name in args.fetch_clients:
        if name not in CLIENTS:
            parser.error(f"unknown fetch client {name!r}; choose from {', '.join(CLIENTS)}")
    args.latency_sweep = [float(x) for x in str(args.latency_sweep).split(",") if x.strip()]
    args.latency_sweep = args.latency_sweep or [args.latency_ms]
    # 0 stands for the self-tuned default (max_inflight_requests=None) in the sweep's rows.
    args.inflight_sweep = _int_list(str(args.inflight_sweep).replace("auto", str(SELF_TUNED)))
    args.fetch_concurrency = _int_list(str(args.fetch_concurrency))

    for name in (
        "images",
        "batch_size",
        "repeats",
        "warmup_batches",
        "run_images",
        "max_inflight_requests",
        "sweep_repeats",
        "fetch_rounds",
        "image_size",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    if any(v < 1 for v in args.fetch_concurrency) or any(v < 0 for v in args.inflight_sweep):
        parser.error("--inflight-sweep values must be >= 1 or auto, --fetch-concurrency >= 1")
    if any(v < 0 for v in args.latency_sweep) or args.latency_ms < 0:
        parser.error("latencies must be >= 0 ms")
    if args.images < 2 * args.batch_size:
        parser.error(f"--images must hold at least two batches of --batch-size {args.batch_size}")
    return args


class Runner:
    """Runs measurement subprocesses and keeps the storage side's CPU accounts."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], workdir: Path) -> None:
        self.args = args
        self.env = env
        self.workdir = workdir
        self.count = 0

    def measure(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run one spec in a fresh subprocess; its result, or ``{"error": ...}``."""
        self.count += 1
        spec_path = self.workdir / f"run{self.count}.spec.json"
        out_path = self.workdir / f"run{self.count}.out.json"
        log_path = self.workdir / f"run{self.count}.log"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "benchmarks.measure", str(spec_path), str(out_path)]
        with open(log_path, "wb") as log:
            # A session of its own, so a timeout can end the run's workers with it.
            proc = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=self.args.run_timeout)
            except subprocess.TimeoutExpired:
                rc = None
            except BaseException:
                _kill_group(proc)
                raise
            if rc is None:
                _kill_group(proc)
        if rc == 0 and out_path.exists():
            result: dict[str, Any] = json.loads(out_path.read_text())
            return result
        tail = log_path.read_text(errors="replace")[-2000:].strip()
        what = f"timed out after {self.args.run_timeout:g} s" if rc is None else f"exit {rc}"
        return {
            "error": f"{what}: {tail.splitlines()[-1] if tail else 'no output'}",
            "log_tail": tail,
        }


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _Storage:
    """The S3 server and the proxies in front of it, with their CPU time."""

    def __init__(self, stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
        from concurrent_loader.testing import LocalS3Server

        self.stack = stack
        self.args = args
        args.s3_dir.mkdir(parents=True, exist_ok=True)
        self.server = stack.enter_context(
            LocalS3Server(data_dir=args.s3_dir, cpus=set(args.storage_cpus))
        )
        self.proxies: dict[float, Any] = {}
        self.proxy_pids: list[int] = []

    def proxy(self, latency_ms: float) -> Any:
        """The proxy adding ``latency_ms``; started on first use, stopped at exit."""
        if latency_ms not in self.proxies:
            from concurrent_loader.testing import ProxyProcess

            proxy = self.stack.enter_context(
                ProxyProcess(
                    upstream=self.server.endpoint_url,
                    latency_ms=latency_ms,
                    jitter_ms=self.args.jitter_ms,
                    bandwidth_bytes_per_s=self.args.bandwidth,
                    cpus=set(self.args.storage_cpus),
                )
            )
            self.proxies[latency_ms] = proxy
            self.proxy_pids.append(proxy.pid)
        return self.proxies[latency_ms]

    def server_cpu_seconds(self) -> float:
        return float(self.server.cpu_seconds())


def _loader_params(
    args: argparse.Namespace,
    config: str,
    endpoint_url: str,
    bucket: str,
    train_dir: Path,
    max_inflight: int,
) -> dict[str, Any]:
    return asdict(
        LoaderParams(
            config=config,
            batch_size=args.batch_size,
            workers=args.workers,
            image_size=args.image_size,
            seed=args.seed,
            max_inflight_requests=max_inflight,
            endpoint_url=endpoint_url,
            region=REGION,
            bucket=bucket,
            prefix="train/",
            local_train_dir=str(train_dir.resolve()),
        )
    )


@contextlib.contextmanager
def _progress(total: int, disable: bool) -> Iterator[Any]:
    from tqdm import tqdm

    bar = tqdm(total=total, unit="run", disable=disable, dynamic_ncols=True, leave=False)
    try:
        yield bar
    finally:
        bar.close()


def _measure_loader(
    runner: Runner,
    storage: _Storage,
    args: argparse.Namespace,
    config: str,
    latency_ms: float,
    max_inflight: int,
    bucket: str,
    train_dir: Path,
) -> dict[str, Any]:
    proxy = storage.proxy(latency_ms)
    spec = {
        "kind": "loader",
        "client_cpus": args.client_cpus,
        "warmup_batches": args.warmup_batches,
        "run_images": args.run_images,
        "params": _loader_params(args, config, proxy.endpoint_url, bucket, train_dir, max_inflight),
    }
    proxy_cpu0, server_cpu0 = proxy.cpu_seconds(), storage.server_cpu_seconds()
    result = runner.measure(spec)
    result["proxy_cpu_s"] = proxy.cpu_seconds() - proxy_cpu0
    result["server_cpu_s"] = storage.server_cpu_seconds() - server_cpu0
    result["latency_ms"] = latency_ms
    result["max_inflight_requests"] = max_inflight
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)

    machine = report.describe_machine()
    print(report.header(args, machine), flush=True)

    spec = DatasetSpec(images=args.images, classes=args.classes, seed=args.seed)
    local, generated = _generate(spec, args)

    results: dict[str, Any] = {
        "schema": 1,
        "command": "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": machine,
        "settings": report.settings(args),
        "dataset": {
            **asdict(spec),
            "name": spec.name,
            "files": local.files,
            "total_bytes": local.total_bytes,
            "mean_object_kb": local.mean_object_bytes / 1000,
            "generated_now": generated,
        },
        "cpus": {"storage": args.storage_cpus, "client": args.client_cpus},
        "configs": {},
        "sweeps": {"latency": [], "max_inflight": []},
        "fetch": {},
    }

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        storage = _Storage(stack, args)
        bucket, uploaded = ensure_uploaded(local, storage.server)
        results["dataset"]["bucket"] = bucket
        results["dataset"]["uploaded_now"] = uploaded
        results["servers"] = {"s3_pid": storage.server.pid, "proxy_pids": storage.proxy_pids}

        env = dict(os.environ)
        env.update(storage.server.env())
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        # Nothing in a run may go around the proxy or wait on an instance-metadata lookup.
        env["AWS_ENDPOINT_URL"] = storage.proxy(args.latency_ms).endpoint_url
        env["AWS_EC2_METADATA_DISABLED"] = "true"
        env.setdefault("AWS_REGION", REGION)
        env.setdefault("AWS_DEFAULT_REGION", REGION)
        runner = Runner(args, env, Path(tmp))

        plan = _plan(args)
        with _progress(len(plan), args.no_progress) as bar:
            for step in plan:
                bar.set_description(step["label"])
                _execute(step, runner, storage, args, bucket, local, results, bar)
                bar.update(1)

        _finish_sweeps(args, results)
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        results["wall_s"] = time.time() - started
        results["storage_stats"] = _proxy_stats(storage)

    results["targets"] = report.evaluate_targets(results)
    json_path = args.out / "results.json"
    json_path.write_text(json.dumps(results, indent=1, default=str))
    png_path = report.plot(results, args.out / "results.png")
    print(report.render_terminal(results))
    print(f"\nJSON: {json_path}" + (f"\nPlot: {png_path}" if png_path else ""))
    if args.write_results:
        md_path = REPO_ROOT / "benchmarks" / "RESULTS.md"
        if png_path:
            # RESULTS.md is committed; the out/ folder is not, so the plot goes beside it.
            shutil.copyfile(png_path, md_path.with_suffix(".png"))
            results["plot_in_repo"] = md_path.with_suffix(".png").name
        existing = md_path.read_text() if md_path.exists() else ""
        md_path.write_text(
            report.kept_head(existing)
            + report.render_markdown(results)
            + report.kept_sections(existing)
        )
        print(f"Results: {md_path}")
    failed = [n for n, c in results["configs"].items() if c["status"] == "error"]
    failed += [n for n, c in results["fetch"].items() if c["status"] == "error"]
    return 1 if failed else 0


def _generate(spec: DatasetSpec, args: argparse.Namespace) -> tuple[Any, bool]:
    from tqdm import tqdm

    with tqdm(
        total=spec.images, unit="img", desc="dataset", disable=args.no_progress, leave=False
    ) as bar:
        return ensure_local(spec, args.data_dir, progress=bar)


def _plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run, in order. Repeats are interleaved so slow drift hits every config alike."""
    steps: list[dict[str, Any]] = []
    if not args.fetch_only:
        for config in args.configs:
            reason = unavailable_reason(config)
            if reason:
                steps.append(
                    {
                        "kind": "skip",
                        "config": config,
                        "reason": reason,
                        "label": f"{config}: not run",
                    }
                )
        runnable = [c for c in args.configs if not unavailable_reason(c)]
        for r in range(args.repeats):
            for config in runnable:
                steps.append(
                    {
                        "kind": "loader",
                        "config": config,
                        "repeat": r,
                        "latency_ms": args.latency_ms,
                        "max_inflight": args.max_inflight_requests,
                        "label": f"{config} #{r + 1}",
                    }
                )
        if "ours-s3" in runnable:
            for latency in args.latency_sweep:
                if latency == args.latency_ms:
                    continue  # the main runs are this sweep point
                for r in range(args.sweep_repeats):
                    steps.append(
                        {
                            "kind": "sweep-latency",
                            "config": "ours-s3",
                            "repeat": r,
                            "latency_ms": latency,
                            "max_inflight": args.max_inflight_requests,
                            "label": f"ours-s3 @{latency:g} ms #{r + 1}",
                        }
                    )
            for inflight in args.inflight_sweep:
                if inflight == args.max_inflight_requests:
                    continue
                for r in range(args.sweep_repeats):
                    steps.append(
                        {
                            "kind": "sweep-inflight",
                            "config": "ours-s3",
                            "repeat": r,
                            "latency_ms": args.latency_ms,
                            "max_inflight": inflight,
                            "label": f"ours-s3 inflight={inflight} #{r + 1}",
                        }
                    )
    if not args.no_fetch:
        for client in args.fetch_clients:
            steps.append({"kind": "fetch", "client": client, "label": f"fetch {client}"})
    return steps


def _execute(
    step: dict[str, Any],
    runner: Runner,
    storage: _Storage,
    args: argparse.Namespace,
    bucket: str,
    local: Any,
    results: dict[str, Any],
    bar: Any,
) -> None:
    kind = step["kind"]
    if kind == "skip":
        c = CONFIGS[step["config"]]
        results["configs"][c.name] = {
            **asdict(c),
            "status": "not run",
            "reason": step["reason"],
            "runs": [],
        }
        return
    if kind == "fetch":
        _execute_fetch(step["client"], runner, storage, args, bucket, local.spec, results)
        return

    result = _measure_loader(
        runner,
        storage,
        args,
        step["config"],
        step["latency_ms"],
        step["max_inflight"],
        bucket,
        local.train_dir,
    )
    if kind == "loader":
        c = CONFIGS[step["config"]]
        entry = results["configs"].setdefault(
            c.name, {**asdict(c), "status": "ok", "reason": None, "runs": []}
        )
        entry["runs"].append(result)
        if "error" in result:
            entry["status"], entry["reason"] = "error", result["error"]
        entry["summary"] = report.summarise(entry["runs"])
        if "error" in result:
            bar.write(f"  {step['label']}: ERROR {result['error']}")
        else:
            bar.write(f"  {step['label']}: {result['images_per_s']:.1f} img/s")
    else:
        sweep = "latency" if kind == "sweep-latency" else "max_inflight"
        results["sweeps"][sweep].append({"config": step["config"], **result})


def _execute_fetch(
    client: str,
    runner: Runner,
    storage: _Storage,
    args: argparse.Namespace,
    bucket: str,
    spec: DatasetSpec,
    results: dict[str, Any],
) -> None:
    reason = fetch_unavailable_reason(client)
    if reason:
        results["fetch"][client] = {"status": "not run", "reason": reason}
        return
    proxy = storage.proxy(args.fetch_latency_ms)
    run_spec = {
        "kind": "fetch",
        "client": client,
        "client_cpus": args.client_cpus,
        "bucket": bucket,
        "endpoint_url": proxy.endpoint_url,
        "region": REGION,
        "keys": list_keys(spec),
        "concurrency": args.fetch_concurrency,
        "rounds": args.fetch_rounds,
        "min_requests": args.fetch_min_requests,
    }
    proxy_cpu0 = proxy.cpu_seconds()
    result = runner.measure(run_spec)
    proxy_cpu = proxy.cpu_seconds() - proxy_cpu0
    if "error" in result:
        results["fetch"][client] = {
            "status": "error",
            "reason": result["error"],
            "log_tail": result.get("log_tail"),
        }
    else:
        results["fetch"][client] = {
            "status": "ok",
            "reason": None,
            **result,
            "latency_ms": args.fetch_latency_ms,
            "proxy_cpu_s": proxy_cpu,
        }


def _finish_sweeps(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Sweep points that equal the main settings reuse the main ours-s3 runs."""
    main = results["configs"].get("ours-s3", {})
    main_ok = [r for r in main.get("runs", []) if "error" not in r]
    for sweep, key, main_value, values in (
        ("latency", "latency_ms", args.latency_ms, args.latency_sweep),
        ("max_inflight", "max_inflight_requests", args.max_inflight_requests, args.inflight_sweep),
    ):
        if main_value in values:
            results["sweeps"][sweep].extend({"config": "ours-s3", **r} for r in main_ok)
        results["sweeps"][sweep] = report.summarise_sweep(results["sweeps"][sweep], key)
    local = results["configs"].get("ours-local", {}).get("summary")
    results["sweeps"]["reference"] = {
        "ours-local": local["images_per_s"] if local else None,
        "stock-s3": (results["configs"].get("stock-s3", {}).get("summary") or {}).get(
            "images_per_s"
        ),
    }


def _proxy_stats(storage: _Storage) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for latency, proxy in storage.proxies.items():
        try:
            out[f"{latency:g}ms"] = proxy.stats()
        except Exception as exc:  # stats are a record, never a reason to fail the run
            out[f"{latency:g}ms"] = {"error": repr(exc)}
    return out
