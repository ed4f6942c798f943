"""The ``concurrent-loader pack`` command: its arguments, and running :func:`.pack.pack`
from them (:mod:`concurrent_loader.cli` adds the common options and prints the summary).

``--endpoint-url``, ``--region``, ``--profile`` and ``--anonymous`` apply to whichever of
``SRC`` and ``DEST`` is on S3, to both when both are; given with neither on S3 they are
refused. Objects left out because no reader would make them part of a sample are named on
stderr, and not counted in the samples written.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..listing import progress
from .packplan import first_few

if TYPE_CHECKING:
    from .pack import PackResult

__all__ = ["add_pack_arguments", "run_pack"]


def add_pack_arguments(parser: argparse.ArgumentParser) -> None:
    """``DEST`` and the options of ``pack`` (after the common ``SRC`` and store options)."""
    parser.epilog = (
        "--endpoint-url, --region, --profile and --anonymous apply to whichever of SRC and "
        "DEST is on S3, to both when both are. Objects that no reader makes part of a "
        "sample (dotfiles, names without an extension) are skipped and named."
    )
    parser.add_argument("dest", help="a local directory or s3://bucket/prefix for the shards")
    parser.add_argument(
        "--shard-size",
        default="256MB",
        help="close a shard before a sample that would take it past this (default 256MB; "
        "MB/GB are powers of 1000, MiB/GiB of 1024)",
    )
    parser.add_argument(
        "--image-folder",
        action="store_true",
        help="SRC is ROOT/<class>/<image>: add a .cls member (the class index) per image",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier pack in DEST: remove its shard-NNNNNN.tar and .tar.idx "
        "files (and only those) first",
    )


def run_pack(args: argparse.Namespace) -> PackResult:
    """Pack as ``args`` say, naming on stderr what was removed or skipped."""
    from .pack import pack, parse_size

    shard_size = parse_size(args.shard_size)
    with progress(args.progress, "packing") as tick:
        result = pack(
            args.root,
            args.dest,
            shard_size=shard_size,
            image_folder=args.image_folder,
            overwrite=args.overwrite,
            on_sample=tick,
            endpoint_url=args.endpoint_url,
            region=args.region,
            profile=args.profile,
            anonymous=args.anonymous,
        )
    if result.removed:
        print(f"removed the earlier pack's {len(result.removed)} files", file=sys.stderr)
    if result.skipped:
        print(
            f"skipped {len(result.skipped)} objects that no reader makes part of a sample "
            f"(a dotfile, no extension, or a webdataset metadata name): "
            f"{first_few(result.skipped)}",
            file=sys.stderr,
        )
    return result
