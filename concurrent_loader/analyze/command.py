"""The arguments of ``concurrent-loader analyze ROOT`` and what the command does with them:
print the report, and with ``--out DIR`` write ``report.txt``, ``rate.png`` and
``analysis.json`` there."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from ..shards.pack import parse_size
from ..stores import StoreConfig
from . import analyze
from .report import format_report, write_outputs

__all__ = ["add_analyze_arguments", "run_analyze"]


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = getattr(kind, "__name__", "number")  # argparse names it in its error
    return parse


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpus",
        type=_positive(int),
        help="cores the loader may use (default: those this process may run on)",
    )
    parser.add_argument(
        "--seconds",
        type=_positive(float),
        default=60.0,
        help="time for the measurements, split across them (default 60; listing not counted)",
    )
    parser.add_argument("--batch-size", type=_positive(int), default=64, help="(default 64)")
    parser.add_argument(
        "--image-size",
        type=_positive(int),
        default=224,
        help="images are decoded to this square size (default 224)",
    )
    parser.add_argument(
        "--objects", action="store_true", help="read ROOT as raw objects even if it has images"
    )
    step = parser.add_mutually_exclusive_group()
    step.add_argument(
        "--step-ms",
        type=_positive(float),
        help="training step time per batch, to predict the stall",
    )
    step.add_argument(
        "--step-rate", type=_positive(float), help="training step rate in samples/s (instead)"
    )
    parser.add_argument(
        "--cache-budget",
        help="also measure a node cache of this size (like 2GB or 512MiB), through a "
        "temporary directory",
    )
    parser.add_argument("--out", help="write report.txt, rate.png and analysis.json here")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run_analyze(args: argparse.Namespace, store: StoreConfig) -> int:
    budget = parse_size(args.cache_budget) if args.cache_budget else None
    step_rate = args.step_rate
    if args.step_ms is not None:
        step_rate = args.batch_size / (args.step_ms / 1000)
    result = analyze(
        store,
        cpus=args.cpus,
        seconds=args.seconds,
        batch_size=args.batch_size,
        image_size=args.image_size,
        objects=args.objects,
        step_rate=step_rate,
        cache_budget=budget,
        progress=args.progress,
    )
    if args.out:
        text_path, png_path = write_outputs(result, args.out)
        with open(os.path.join(args.out, "analysis.json"), "w", encoding="utf-8") as f:
            json.dump(result.summary(), f, indent=2)
        print(f"wrote {text_path} and {png_path}", file=sys.stderr)
    print(json.dumps(result.summary(), indent=2) if args.json else format_report(result))
    return 0
