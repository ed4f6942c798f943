"""The ``concurrent-loader`` command line (also ``python -m concurrent_loader``).

Commands::

    concurrent-loader manifest ROOT -o FILE [--endpoint-url URL] [--anonymous] ...
    concurrent-loader inspect  ROOT [--image-folder] [--json] [--endpoint-url URL] ...
    concurrent-loader pack     SRC DEST [--shard-size 256MB] [--image-folder] ...
    concurrent-loader cache warm [ROOT] [--manifest FILE] --cache DIR [--max-bytes N]
                                 [--presize SHORT_SIDE [--format jpeg|raw] [--quality Q]] ...
    concurrent-loader cache info DIR [--json]
    concurrent-loader cache clear DIR

Each command's ``--help`` says what it does. ``ROOT`` is ``s3://bucket/prefix`` or a local
directory; credentials and endpoint follow the AWS chain unless given as options. Errors
print one line, ``concurrent-loader: error: <message>``, and exit with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO

import numpy as np

from .cache import CacheConfig, CachedStoreConfig, clear_cache, describe_cache
from .cache.warm import warm_cache
from .dataset import IMG_EXTENSIONS, ImageFolder, ObjectDataset
from .errors import ConfigError, LoaderError
from .keys import KeyTable, refused_key
from .listing import list_store, progress
from .shards.pack import add_pack_arguments, add_presize_arguments, presize_from, run_pack
from .stores import S3Config, StoreConfig, store_config_for

__all__ = ["main"]

PROG = "concurrent-loader"


def root_config(root: str, args: argparse.Namespace) -> StoreConfig:
    """``root``'s store config, with the S3 options given (a ``ConfigError`` for a root that
    is not on S3)."""
    options = ("endpoint_url", "region", "profile", "anonymous")
    given = {
        name: getattr(args, name) for name in options if getattr(args, name) not in (None, False)
    }
    return S3Config.from_url(root, **given) if given else store_config_for(root)


def manifest_text(keys: Iterable[str], store: StoreConfig) -> str:
    """The manifest of ``keys``, one per line; a key ``ObjectDataset.from_manifest`` would
    not read back as itself is refused with ``ConfigError`` naming it, before any write."""
    lines = []
    for key in keys:
        why = refused_key(key)
        if why is not None:
            raise ConfigError(
                f"the key {key!r} cannot be written to a line-based manifest: {why}; "
                "pass keys= to ObjectDataset instead",
                url=store.url_for(key),
            )
        lines.append(f"{key}\n")
    return "".join(lines)


def cmd_manifest(args: argparse.Namespace) -> int:
    store = root_config(args.root, args)
    with progress(args.progress, "listing") as tick:
        found = list_store(store, on_object=tick)
    text = manifest_text((item.key for item in found), store)
    written = args.output
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        # The binary form beside the text: the same keys and their sizes, loaded without parsing.
        sizes = np.fromiter((item.size for item in found), dtype=np.int64, count=len(found))
        table = KeyTable((item.key for item in found), {"sizes": sizes})
        _write_atomically(args.output, lambda f: f.write(text.encode("utf-8")))
        _write_atomically(args.output + ".bin", table.save)
        written = f"{args.output} (and {args.output}.bin)"
    total = sum(item.size for item in found)
    print(
        f"wrote {len(found)} keys ({_human_bytes(total)}) under {store} to {written}",
        file=sys.stderr,
    )
    return 0


def _write_atomically(path: str, write: Callable[[BinaryIO], object]) -> None:
    """``write(file)`` through a temporary file, so a reader never sees half."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=directory)
    except OSError as exc:  # name the file asked for, not the temporary one
        raise OSError(exc.errno, f"cannot write the manifest: {exc.strerror}", path) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cmd_inspect(args: argparse.Namespace) -> int:
    store = root_config(args.root, args)
    with progress(args.progress, "listing") as tick:
        found = list_store(store, on_object=tick)
    report: dict[str, Any] = {"root": str(store), "objects": len(found)}
    report["bytes"] = sum(item.size for item in found)
    if args.image_folder:
        # The same rules as ImageFolder itself: class folders, image extensions.
        folder = ImageFolder(store, keys=[item.key for item in found])
        counts = np.bincount(folder.targets, minlength=len(folder.classes)).tolist()
        report["images"] = len(folder)
        report["classes"] = dict(zip(folder.classes, counts, strict=True))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"root:    {report['root']}")
    print(f"objects: {report['objects']}")
    print(f"bytes:   {report['bytes']} ({_human_bytes(report['bytes'])})")
    if args.image_folder:
        classes: dict[str, int] = report["classes"]
        print(f"images:  {report['images']} in {len(classes)} classes")
        width = max(len(name) for name in classes)
        for name, count in classes.items():
            print(f"  {name:<{width}}  {count}")
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    result = run_pack(args)
    print(
        f"wrote {result.samples} samples in {len(result.shards)} shards "
        f"({_human_bytes(result.bytes)}) to {args.dest}",
        file=sys.stderr,
    )
    return 0


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def cmd_cache_warm(args: argparse.Namespace) -> int:
    if args.root is None and args.manifest is None:
        raise ConfigError("cache warm needs ROOT or --manifest FILE")
    presize = presize_from(args, args.presize, "--presize")
    cache = CacheConfig(args.cache, max_bytes=args.max_bytes, presize=presize)
    options: dict[str, Any] = {"cache": cache, "progress": args.progress}
    if args.manifest is not None:
        # The manifest's folder is the root unless ROOT is given; either takes the options.
        root = args.root if args.root is not None else os.path.dirname(args.manifest) + "/"
        dataset = ObjectDataset.from_manifest(args.manifest, root_config(root, args), **options)
    else:
        dataset = ObjectDataset(root_config(args.root, args), **options)
    store = dataset.store
    if not isinstance(store, CachedStoreConfig):
        raise ConfigError(
            f"{store} is not cached (a local directory, or a cache that cannot be used: "
            "see the warning above)"
        )
    keys = list(dataset.keys)
    with progress(args.progress, f"warming {args.cache}") as tick:
        report = warm_cache(
            store, keys, dataset.fetch_config, on_object=tick, processes=args.processes
        )
    info = describe_cache(store.cache.directory)
    form = "" if presize is None else f" as {presize.identity}"
    print(
        f"read {report.objects} objects ({_human_bytes(report.bytes)}{form}) of {store}, "
        f"{report.already_cached} already cached; the cache holds {info['entries']} entries "
        f"({_human_bytes(info['bytes'])}) of a budget of {_human_bytes(store.cache.budget)}",
        file=sys.stderr,
    )
    return 0


def cmd_cache_info(args: argparse.Namespace) -> int:
    info = describe_cache(args.directory)  # CacheRefused (a ConfigError) if it is not a cache
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rate = info["hit_rate"]
    print(f"directory:  {info['directory']}")
    print(f"forms:      {', '.join(info['forms']) or '-'}")
    print(f"entries:    {info['entries']}")
    print(f"bytes:      {info['bytes']} ({_human_bytes(info['bytes'])})")
    print(f"hits:       {info['hits']} ({_human_bytes(info['bytes_served'])} served)")
    print(f"misses:     {info['misses']}")
    print(f"hit rate:   {'-' if rate is None else f'{rate:.1%}'}")
    if info["temporary_files"]:
        print(f"unfinished: {info['temporary_files']} temporary files (writers that died)")
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    removed = clear_cache(args.directory)
    print(f"removed {removed} entries from {os.path.abspath(args.directory)}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Tools for concurrent_loader datasets.")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="logging level (default WARNING)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("root", help="s3://bucket/prefix or a local directory")
        _store_options(sub)

    manifest = commands.add_parser(
        "manifest",
        help="list ROOT once and write its keys, one per line, for ObjectDataset.from_manifest "
        "(and FILE.bin beside it: the keys and their sizes, which load faster)",
    )
    common(manifest)
    manifest.add_argument(
        "-o", "--output", required=True, help="the manifest file to write ('-' for stdout)"
    )
    manifest.set_defaults(run=cmd_manifest)

    inspect = commands.add_parser("inspect", help="count the objects and bytes under ROOT")
    common(inspect)
    inspect.add_argument(
        "--image-folder",
        action="store_true",
        help=f"also count images ({', '.join(IMG_EXTENSIONS)}) per ROOT/<class>/ folder",
    )
    inspect.add_argument("--json", action="store_true", help="print a JSON object instead")
    inspect.set_defaults(run=cmd_inspect)

    pack = commands.add_parser(
        "pack", help="pack the objects under SRC into tar shards and their indexes under DEST"
    )
    common(pack)
    add_pack_arguments(pack)
    pack.set_defaults(run=cmd_pack)

    from .analyze.command import add_analyze_arguments, run_analyze  # its code: analyze/

    analyze = commands.add_parser(
        "analyze", help="measure ROOT's ingest, decode and end-to-end rates; predict the stall"
    )
    common(analyze)
    add_analyze_arguments(analyze)
    analyze.set_defaults(run=lambda args: run_analyze(args, root_config(args.root, args)))

    _cache_commands(commands)
    return parser


def _store_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--endpoint-url", help="S3 endpoint (default: AWS chain)")
    sub.add_argument("--region", help="S3 region (default: AWS chain)")
    sub.add_argument("--profile", help="AWS profile name")
    sub.add_argument("--anonymous", action="store_true", help="unsigned requests (public buckets)")
    sub.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bar")


def _cache_commands(commands: Any) -> None:
    cache = commands.add_parser("cache", help="warm, inspect or clear a node-local cache")
    actions = cache.add_subparsers(dest="action", required=True)
    warm = actions.add_parser("warm", help="read every object of ROOT once through the cache")
    warm.add_argument("root", nargs="?", help="s3://bucket/prefix (default: the manifest's)")
    warm.add_argument("--manifest", help="read the keys of this manifest")
    warm.add_argument("--cache", required=True, help="the cache directory")
    warm.add_argument("--max-bytes", type=int, help="the cache's byte budget")
    warm.add_argument(
        "--presize",
        type=int,
        metavar="SHORT_SIDE",
        help="keep each image pre-sized to this shorter side instead of its bytes "
        "(the dataset must name the same setting: CacheConfig(presize=Presize(...)))",
    )
    add_presize_arguments(warm, "--presize")
    _store_options(warm)
    warm.set_defaults(run=cmd_cache_warm)
    info = actions.add_parser("info", help="what a cache holds, and the reads it served")
    info.add_argument("directory")
    info.add_argument("--json", action="store_true", help="print a JSON object instead")
    info.set_defaults(run=cmd_cache_info)
    clear = actions.add_parser(
        "clear", help="remove every entry of a cache (only the files the cache wrote)"
    )
    clear.add_argument("directory")
    clear.set_defaults(run=cmd_cache_clear)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    try:
        status: int = args.run(args)
    except (LoaderError, OSError) as exc:  # OSError: writing the manifest, a local root
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return status
