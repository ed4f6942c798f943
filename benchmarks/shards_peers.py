"""Sharded data over S3: ours streaming against the peers, and one large shard at link speed.

    python -m benchmarks.shards_peers [--smoke] [--workers 2] [--images 2048] ...

Two parts, each printed as a table and written to ``--out``/``shards_peers.json``:

1. **Peers on the same data and server.** The benchmark's generated JPEGs
   (:mod:`benchmarks.data`) packed into WebDataset tar shards with the ``webdataset``
   library's ``ShardWriter`` (members ``{key}.jpg`` and ``{key}.cls``), uploaded to a local
   S3 server behind a +``--latency-ms`` proxy, and read for one epoch, with the same decode
   (JPEG -> ``uint8 [3, S, S]``), batch size and number of workers, by:

   - ``ours-stream``: ``ConcurrentDataLoader`` with ``ShardOrderSampler`` over a shard
     dataset (each sample one ranged GET of its member);
   - ``ours-stream-readahead``: the same with ``ShardDataset(readahead=Readahead())`` and
     ``ShardOrderSampler``, told the workers by the loader: each worker reads shards of its own,
     in aligned 8 MiB spans, and serves the samples from them;
   - ``ours-random-readahead``: random access, a seeded permutation of all samples
     (map-style), with read-ahead room for every span of the shards in each worker;
   - ``webdataset``: the ``webdataset`` library and a stock ``DataLoader``, each shard
     streamed with ``curl`` from a presigned URL (how it reads S3 without the AWS CLI);
   - ``litdata``: LitData's ``optimize`` of the same samples into its chunks, uploaded, and
     read with ``StreamingDataset`` + ``StreamingDataLoader``;
   - Mosaic ``streaming`` (MDS) where it imports (listed with the reason otherwise).

   Before timing, the samples ours reads are checked against the ``webdataset`` library's own
   reading of the same shards: the same keys, labels and bytes.

   Ours reads through ``concurrent_loader.ShardDataset`` where the library has it, else
   through :class:`ShardStandIn` (a map-style dataset over the tar index, the same
   numbering: shard by shard, tar order; one ranged GET per sample): see
   :func:`ours_dataset`; the JSON names which one (``ours_dataset``).

2. **One large object at link speed** (:mod:`benchmarks.parts_bandwidth`): one
   ``--big-mb`` object through a proxy capping the bandwidth in total and per connection,
   read by one worker in parts and with one GET.

``--smoke`` runs everything tiny, for the CI test: it checks correctness, not speed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.data import DatasetSpec, ensure_local
from benchmarks.parts_bandwidth import add_arguments, run_bandwidth, smoke
from benchmarks.transform import make_decoder
from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset
from concurrent_loader.sources import Read
from concurrent_loader.sources.load import load_samples
from concurrent_loader.stores import S3Config
from concurrent_loader.stores.base import ByteRange
from concurrent_loader.streaming import ShardOrderSampler
from concurrent_loader.testing import LocalS3Server, ProxyProcess

BUCKET = "shards-bench"
MiB = 1024 * 1024


# ---------------------------------------------------------------- shards and their index


@dataclass(frozen=True)
class Member:
    """Sample ``key``'s JPEG: bytes ``offset .. offset + size`` of ``shard``; its label."""

    shard: str
    key: str
    offset: int
    size: int
    label: int


def pack_webdataset(spec: DatasetSpec, train_dir: Path, out: Path, shard_bytes: int) -> list[str]:
    """The images as ``{key}.jpg`` + ``{key}.cls`` in tar shards (``webdataset.ShardWriter``),
    in index order; returns the shard file names in shard order."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    pattern = str(out / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=shard_bytes, maxcount=10**9, verbose=0) as sink:
        for index in range(spec.images):
            path = train_dir.parent / spec.relative_path(index)
            sink.write(
                {
                    "__key__": f"{index:07d}",
                    "jpg": path.read_bytes(),
                    "cls": str(index % spec.classes).encode(),
                }
            )
    return sorted(p.name for p in out.glob("shard-*.tar"))


def index_shards(directory: Path, shards: Sequence[str]) -> list[Member]:
    """Every ``.jpg`` member, shard by shard in tar order, with its label from ``.cls``."""
    members: list[Member] = []
    for shard in shards:
        with tarfile.open(directory / shard) as tar:
            labels: dict[str, int] = {}
            jpgs: list[tarfile.TarInfo] = []
            for info in tar:
                key, _, ext = info.name.partition(".")
                if ext == "cls":
                    labels[key] = int(tar.extractfile(info).read())  # type: ignore[union-attr]
                elif ext == "jpg":
                    jpgs.append(info)
            members += [
                Member(
                    shard,
                    i.name.partition(".")[0],
                    i.offset_data,
                    i.size,
                    labels[i.name.partition(".")[0]],
                )
                for i in jpgs
            ]
    return members


# ---------------------------------------------------------------- ours


class MemberSource:
    """A :class:`~concurrent_loader.sources.SampleSource`: sample ``i`` is one ranged read of
    its member; ``(decode(jpeg), label)``."""

    def __init__(
        self, objects: ObjectDataset, members: Sequence[Member], decode: Callable[[Any], Any]
    ):
        self.store = objects.source.store
        self.fetch_config = objects.source.fetch_config
        self.members = list(members)
        self.decoder = decode

    def __len__(self) -> int:
        return len(self.members)

    def reads(self, index: int) -> Sequence[Read]:
        m = self.members[index]
        return (Read(m.shard, ByteRange(m.offset, m.offset + m.size), m.size),)

    def decode(self, index: int, bodies: Sequence[bytes | bytearray]) -> Any:
        return self.decoder(bodies[0]), self.members[index].label

    def url_for(self, index: int) -> str:
        m = self.members[index]
        return f"{self.store.url_for(m.shard)}#{m.key}.jpg"


class ShardStandIn(Dataset[Any]):
    """A map-style shard dataset with ``ShardDataset``'s contract: index ``i`` enumerates the
    samples shard by shard in shard order; ``shards`` and ``shard_lengths``."""

    def __init__(
        self, objects: ObjectDataset, members: Sequence[Member], decode: Callable[[Any], Any]
    ):
        self._objects = objects  # the store and this process's runtime, for ds[i]
        self.source = MemberSource(objects, members, decode)
        self.shards = list(dict.fromkeys(m.shard for m in members))
        self.shard_lengths = [sum(1 for m in members if m.shard == s) for s in self.shards]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return load_samples(self.source, [index], self._objects._acquire)[0]


@dataclass
class Setup:
    proxy: ProxyProcess
    endpoint_url: str
    members: list[Member]
    shards: list[str]
    shard_dir: Path
    args: argparse.Namespace
    s3: LocalS3Server
    work: Path


class PairOf:
    """``ShardDataset``'s ``decode``: a sample dict -> ``(decode(jpg), label)``."""

    def __init__(self, decode: Callable[[Any], Any]) -> None:
        self.decode = decode

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        return self.decode(sample["jpg"]), int(bytes(sample["cls"]))


def ours_dataset(setup: Setup, decode: Callable[[Any], Any], **options: Any) -> Any:
    """Ours over the shards: ``concurrent_loader.ShardDataset`` (its index built by scanning
    the shards, one ranged GET per sample) where this version of the library has it, else
    :class:`ShardStandIn` (one ranged GET per sample). Both number samples shard by shard in
    tar order, which :func:`check_same_samples` checks."""
    try:
        from concurrent_loader import ShardDataset  # type: ignore[attr-defined]
    except ImportError:
        objects = ObjectDataset(
            S3Config.from_url(f"s3://{BUCKET}/shards/", endpoint_url=setup.endpoint_url),
            keys=setup.shards,
        )
        return ShardStandIn(objects, setup.members, decode)
    options.setdefault("fetch_config", FetchConfig(max_inflight_requests=64))
    return ShardDataset(
        S3Config.from_url(f"s3://{BUCKET}/shards/", endpoint_url=setup.endpoint_url),
        decode=PairOf(decode),
        **options,
    )


def build_ours(
    setup: Setup,
    decode: Callable[[Any], Any],
    **options: Any,
) -> DataLoader[Any]:
    dataset = ours_dataset(setup, decode, **options)
    sampler = ShardOrderSampler(dataset.shard_lengths, buffer_size=setup.args.buffer, seed=0)
    return _ours_loader(setup, dataset, sampler)


def _ours_loader(setup: Setup, dataset: Any, sampler: Any) -> DataLoader[Any]:
    """Every ours row's loader: the run's batch size and workers (64 GETs in flight: the
    dataset's fetch config)."""
    return ConcurrentDataLoader(
        dataset,
        batch_size=setup.args.batch_size,
        sampler=sampler,
        num_workers=setup.args.workers,
    )


def build_ours_readahead(setup: Setup, decode: Callable[[Any], Any]) -> DataLoader[Any]:
    """Ours streaming with read-ahead: each worker reads shards of its own
    (``ShardOrderSampler``, given the workers by the loader) in aligned spans (``Readahead()``
    defaults: 8 MiB spans, 128 MiB kept per process)."""
    from concurrent_loader import Readahead

    return build_ours(setup, decode, readahead=Readahead())


def build_ours_random(setup: Setup, decode: Callable[[Any], Any]) -> DataLoader[Any]:
    """Ours in random access: a seeded random permutation of every sample (map-style, as
    ``shuffle=True`` draws it), read-ahead sized to hold the shards (8 MiB spans), so a
    span is one GET per worker however the order scatters its samples."""
    from concurrent_loader import Readahead

    span = 8 * 1024 * 1024
    shard_bytes = sum((setup.shard_dir / name).stat().st_size for name in setup.shards)
    room = (shard_bytes // span + len(setup.shards) + 2) * span  # every span, cut or whole
    dataset = ours_dataset(setup, decode, readahead=Readahead(span_bytes=span, max_bytes=room))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
    return _ours_loader(setup, dataset, order)


# ---------------------------------------------------------------- peers


def _presigned(setup: Setup, key: str) -> str:
    """A presigned GET of ``key`` through the proxy (credentials from the environment)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=setup.endpoint_url,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    try:
        url: str = client.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=3600
        )
        return url
    finally:
        client.close()


def build_webdataset(setup: Setup, decode: Callable[[Any], Any]) -> DataLoader[Any]:
    import webdataset as wds

    urls = [_presigned(setup, f"shards/{s}") for s in setup.shards]
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None, empty_check=False)
        .shuffle(setup.args.buffer)
        .to_tuple("jpg", "cls")
        .map_tuple(decode, lambda b: int(b))
    )
    return DataLoader(dataset, batch_size=setup.args.batch_size, num_workers=setup.args.workers)


def _litdata_sample(item: tuple[str, int, int], train_dir: str) -> dict[str, Any]:
    path, label, index = item
    return {"index": index, "jpg": Path(train_dir, path).read_bytes(), "cls": label}


def prepare_litdata(setup: Setup, spec: DatasetSpec, train_root: Path, work: Path) -> None:
    from functools import partial

    from litdata import optimize

    out = work / "litdata"
    inputs = [(spec.relative_path(i), i % spec.classes, i) for i in range(spec.images)]
    method = multiprocessing.get_start_method()
    try:
        optimize(
            fn=partial(_litdata_sample, train_dir=str(train_root)),
            inputs=inputs,
            output_dir=str(out),
            chunk_bytes=setup.args.shard_mib * MiB,
            num_workers=1,
            mode="overwrite",
        )
    finally:
        # optimize() switches the whole process to "spawn"; the loaders after it get the
        # start method the others had.
        multiprocessing.set_start_method(method, force=True)
    setup.s3.upload_dir(out, BUCKET, prefix="litdata/")


def _litdata_allow_http(_worker: int = 0) -> None:
    """The local server is plain HTTP, which LitData's obstore client options refuse by
    default (real S3 is HTTPS); allowing it changes nothing else. Set in every process
    (LitData's workers do not see the parent's setting)."""
    import litdata.streaming.downloader as downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"


def build_litdata(setup: Setup, decode: Callable[[Any], Any]) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    _litdata_allow_http()
    cache = tempfile.mkdtemp(prefix="bench-litdata-cache-", dir=setup.work)
    dataset = StreamingDataset(
        f"s3://{BUCKET}/litdata/",
        cache_dir=cache,
        shuffle=True,
        seed=0,
        storage_options={"endpoint_url": setup.endpoint_url},
    )
    # Decoded in the collate, in the workers: the same decode as the other loaders.
    return StreamingDataLoader(
        dataset,
        batch_size=setup.args.batch_size,
        num_workers=setup.args.workers,
        collate_fn=partial_collate(decode),
        worker_init_fn=_litdata_allow_http,
    )


def partial_collate(decode: Callable[[Any], Any]) -> Callable[[list[dict[str, Any]]], Any]:
    from functools import partial

    return partial(_decode_collate, decode)


def _decode_collate(decode: Callable[[Any], Any], items: list[dict[str, Any]]) -> Any:
    images = torch.stack([decode(item["jpg"]) for item in items])
    return images, torch.tensor([int(item["cls"]) for item in items])


def mosaic_unavailable() -> str | None:
    try:
        import streaming  # noqa: F401
    except Exception as exc:  # ImportError, or a dependency failing to load
        return f"`import streaming` fails: {type(exc).__name__}: {str(exc)[:200]}"
    return None


# ---------------------------------------------------------------- measuring


def epoch(loader: Any) -> tuple[dict[str, float], torch.Tensor]:
    """One epoch: images/s after the first batch, first-batch seconds, the labels seen."""
    started = time.perf_counter()
    first = None
    images = 0
    labels = []
    for _images, batch_labels in loader:
        if first is None:
            first = time.perf_counter()
        else:
            images += len(batch_labels)
        labels.append(torch.as_tensor(batch_labels))
    end = time.perf_counter()
    assert first is not None
    return {
        "images_per_s": images / (end - first) if end > first else float("nan"),
        "first_batch_s": first - started,
        "epoch_s": end - started,
    }, torch.cat(labels)


def check_same_samples(setup: Setup) -> tuple[int, str]:
    """Ours (raw bytes) against the ``webdataset`` library's reading of the same shards, in
    shard order: the same keys, labels and bytes. Returns the samples compared and the
    class ours read them through."""
    import webdataset as wds

    theirs = {
        s["__key__"]: (hashlib.sha256(s["jpg"]).hexdigest(), int(s["cls"]))
        for s in wds.WebDataset(
            [str(setup.shard_dir / n) for n in setup.shards], shardshuffle=False, empty_check=False
        )
    }
    dataset = ours_dataset(setup, bytes)
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=16,
        sampler=ShardOrderSampler(dataset.shard_lengths, shuffle=False),
        collate_fn=list,
    )
    ours = {}
    position = 0
    for batch in loader:
        for data, label in batch:
            key = setup.members[position].key
            ours[key] = (hashlib.sha256(data).hexdigest(), label)
            position += 1
    if ours != theirs:
        raise AssertionError(
            f"ours and webdataset differ: {len(ours)} vs {len(theirs)} samples, "
            f"{sum(1 for k in ours if ours[k] != theirs.get(k))} differing"
        )
    return len(ours), type(dataset).__name__


def run_peers(setup: Setup, spec: DatasetSpec, train_root: Path, work: Path) -> dict[str, Any]:
    """Each loader for one epoch, ``--rounds`` times, interleaved (a load on the shared
    machine then hits every loader alike); the median round and every round's figure."""
    args = setup.args
    decode = make_decoder(args.image_size)
    results: dict[str, Any] = {"not_run": {}, "rows": {}}
    results["checked_samples"], results["ours_dataset"] = check_same_samples(setup)
    print(f"ours reads through {results['ours_dataset']}", flush=True)
    builders: dict[str, Callable[[Setup, Callable[[Any], Any]], Any]] = {
        "ours-stream": build_ours,
        "ours-stream-readahead": build_ours_readahead,
        "ours-random-readahead": build_ours_random,
        "webdataset": build_webdataset,
        "litdata": build_litdata,
    }
    names = list(args.only or builders)
    reason = mosaic_unavailable()
    if reason:
        results["not_run"]["mosaic-streaming"] = reason
    if "litdata" in names:
        try:
            prepare_litdata(setup, spec, train_root, work)
        except Exception as exc:
            results["not_run"]["litdata"] = f"optimize failed: {type(exc).__name__}: {exc}"
            names.remove("litdata")
    expected = sorted(m.label for m in setup.members)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            loader = builders[name](setup, decode)
            proxy_cpu, server_cpu = setup.proxy.cpu_seconds(), setup.s3.cpu_seconds()
            setup.proxy.reset_stats()
            figures, labels = epoch(loader)
            # Correctness, not speed: every sample once (labels as a multiset).
            if sorted(labels.tolist()) != expected:
                raise AssertionError(f"{name} did not yield every sample exactly once")
            # Every request through the proxy also costs its CPU on this shared machine.
            figures["gets_per_sample"] = setup.proxy.stats()["requests"] / len(setup.members)
            figures["proxy_cpu_s"] = setup.proxy.cpu_seconds() - proxy_cpu
            figures["server_cpu_s"] = setup.s3.cpu_seconds() - server_cpu
            rounds[name].append(figures)
            print(
                f"{name:12s} {figures['images_per_s']:8.1f} img/s, "
                f"first batch {figures['first_batch_s']:.2f} s, "
                f"{figures['gets_per_sample']:.3f} GETs/sample, "
                f"CPU s: proxy {figures['proxy_cpu_s']:.1f}, server {figures['server_cpu_s']:.1f}",
                flush=True,
            )
            del loader
    for name, figures in rounds.items():
        ranked = sorted(figures, key=lambda f: f["images_per_s"])
        results["rows"][name] = {
            **ranked[len(ranked) // 2],
            "images_per_s_rounds": [f["images_per_s"] for f in figures],
        }
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: correctness only")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--shard-mib", type=int, default=32, help="shard size (MiB)")
    parser.add_argument("--buffer", type=int, default=512, help="shuffle buffer (samples)")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    add_arguments(parser)
    parser.add_argument("--only", nargs="*", help="peer rows to run (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per loader")
    parser.add_argument("--skip-bandwidth", action="store_true")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "concurrent-loader-bench"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args(argv)
    if args.smoke:
        args.images, args.batch_size, args.image_size = 96, 16, 64
        args.shard_mib, args.buffer, args.latency_ms, args.rounds = 1, 32, 5.0, 1
        smoke(args)
    spec = DatasetSpec(images=args.images, classes=args.classes)
    local, _ = ensure_local(spec, args.data_dir)
    results: dict[str, Any] = {
        "command": " ".join(
            [sys.executable, "-m", "benchmarks.shards_peers", *(argv or sys.argv[1:])]
        ),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shards-bench-")))
        s3 = stack.enter_context(LocalS3Server())
        s3.create_bucket(BUCKET)
        for name, value in s3.env().items():
            os.environ[name] = value
        shard_dir = work / "shards"
        shards = pack_webdataset(spec, local.train_dir, shard_dir, args.shard_mib * MiB)
        s3.upload_dir(shard_dir, BUCKET, prefix="shards/")
        members = index_shards(shard_dir, shards)
        proxy = stack.enter_context(ProxyProcess(s3.endpoint_url, latency_ms=args.latency_ms))
        setup = Setup(proxy, proxy.endpoint_url, members, shards, shard_dir, args, s3, work)
        print(
            f"{len(members)} samples in {len(shards)} shards; {args.workers} workers, "
            f"+{args.latency_ms:g} ms",
            flush=True,
        )
        results["peers"] = run_peers(setup, spec, local.train_dir.parent, work)
        if not args.skip_bandwidth:
            results["bandwidth"] = run_bandwidth(s3, BUCKET, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shards_peers.json").write_text(json.dumps(results, indent=1))
    for name, reason in results["peers"]["not_run"].items():
        print(f"not run: {name}: {reason}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
