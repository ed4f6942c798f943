"""``gs://`` end to end against fake-gcs-server: every dataset kind, the node cache,
read-ahead, reads in parts, retries and hedges through the fault proxy, the command line, and
an error naming ``gs://``. Each compares what it reads with the same data on local disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time

import pytest
import torch

from concurrent_loader import (
    ConcurrentDataLoader,
    FetchConfig,
    HedgeConfig,
    ImageFolder,
    ObjectDataset,
    PartsConfig,
    Readahead,
    RetryConfig,
    ShardDataset,
    Timeouts,
)
from concurrent_loader.cli import main
from concurrent_loader.errors import ObjectNotFound
from concurrent_loader.stores import GcsConfig
from concurrent_loader.testing import FaultPlan

from .conftest import BUCKET


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def batches_of(dataset, **loader) -> list[list]:
    return [list(batch) for batch in ConcurrentDataLoader(dataset, **loader)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_object_dataset_reads_every_sample_once_in_sampler_order(gcs_images, gcs_env, num_workers):
    root, files = gcs_images
    keys = [key for key, _, _ in files]
    order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(3)).tolist()
    ds = ObjectDataset(root, keys, decode=sha256_hex)  # a URL: the registry's GcsConfig
    got = batches_of(ds, batch_size=5, sampler=order, num_workers=num_workers)
    assert got == [[files[i][2] for i in order[j : j + 5]] for j in range(0, len(order), 5)]


def test_a_resumed_epoch_continues_with_exactly_the_remaining_batches(gcs_images, gcs_env):
    root, files = gcs_images

    def make_loader() -> ConcurrentDataLoader:
        ds = ObjectDataset(root, [k for k, _, _ in files], decode=sha256_hex)
        generator = torch.Generator().manual_seed(9)
        return ConcurrentDataLoader(
            ds, batch_size=5, shuffle=True, num_workers=2, generator=generator
        )

    whole = [list(b) for b in make_loader()]
    interrupted = make_loader()
    seen = []
    for batch in interrupted:
        seen.append(list(batch))
        if len(seen) == 2:
            state = interrupted.state_dict()
            break
    resumed = make_loader()
    resumed.load_state_dict(state)
    assert seen + [list(b) for b in resumed] == whole


def test_image_folder_over_gcs_matches_the_local_folder(gcs_images, gcs_env, image_folder):
    remote, local = (
        ImageFolder(gcs_images[0], image_size=24),
        ImageFolder(image_folder[0], image_size=24),
    )
    assert (remote.classes, list(remote.keys)) == (local.classes, list(local.keys))
    ours = [
        torch.cat(parts)
        for parts in zip(*ConcurrentDataLoader(remote, batch_size=7, num_workers=2), strict=True)
    ]
    theirs = [
        torch.cat(parts) for parts in zip(*ConcurrentDataLoader(local, batch_size=7), strict=True)
    ]
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_manifest_on_gcs_feeds_the_dataset(gcs_server, gcs_images, gcs_env, tmp_path):
    root, files = gcs_images
    chosen = sorted(files)[::3]
    manifest = tmp_path / "some.txt"
    assert main(["manifest", root, "-o", str(manifest), "--no-progress"]) == 0
    assert manifest.read_text().splitlines() == sorted(key for key, _, _ in files)
    gcs_server.put_object(
        BUCKET, "manifests/some.txt", "".join(f"{k}\n" for k, _, _ in chosen).encode()
    )
    with ObjectDataset.from_manifest(
        f"gs://{BUCKET}/manifests/some.txt", root=root, decode=sha256_hex
    ) as ds:
        assert ds.__getitems__(list(range(len(ds)))) == [digest for _, _, digest in chosen]


def test_a_manifest_read_with_the_roots_options_goes_to_its_endpoint(
    gcs_server, gcs_images, gcs_proxy, monkeypatch
):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)  # only the config says where
    root, files = gcs_images
    gcs_server.put_object(BUCKET, "manifests/two.txt", f"{files[0][0]}\n{files[1][0]}\n".encode())
    proxy = gcs_proxy()
    config = gcs_server.store_config(BUCKET, root.split("/", 3)[3], endpoint_url=proxy.endpoint_url)
    manifest = f"gs://{BUCKET}/manifests/two.txt"
    with ObjectDataset.from_manifest(manifest, root=config, decode=sha256_hex) as ds:
        assert ds.__getitems__([0, 1]) == [files[0][2], files[1][2]]
    assert proxy.stats()["requests_by_method"]["GET"] == 3  # the manifest, then two objects


def test_the_node_cache_serves_the_second_epoch_without_a_get(
    gcs_server, gcs_images, gcs_proxy, tmp_path
):
    root, files = gcs_images
    proxy = gcs_proxy()
    config = gcs_server.store_config(BUCKET, root.split("/", 3)[3], endpoint_url=proxy.endpoint_url)
    ds = ObjectDataset(
        config, [k for k, _, _ in files], decode=sha256_hex, cache=str(tmp_path / "cache")
    )
    want = [[d for _, _, d in files[i : i + 8]] for i in range(0, len(files), 8)]
    assert batches_of(ds, batch_size=8, num_workers=2) == want
    assert proxy.stats()["requests_by_method"]["GET"] == len(files)
    proxy.reset_stats()
    assert batches_of(ds, batch_size=8, num_workers=2) == want
    assert proxy.stats()["requests_by_method"].get("GET", 0) == 0


def test_the_node_cache_keeps_one_bucket_on_two_endpoints_apart(
    gcs_server, gcs_bucket, recorder, tmp_path
):
    gcs_server.put_object(gcs_bucket, "twice/k.bin", b"from the emulator")
    recorder.objects["twice/k.bin"] = b"from elsewhere"
    there = gcs_server.store_config(gcs_bucket, "twice")
    elsewhere = GcsConfig.from_url(
        f"gs://{gcs_bucket}/twice", endpoint_url=recorder.endpoint_url, anonymous=True
    )
    assert there.url_for("k.bin") == elsewhere.url_for("k.bin")
    cache = str(tmp_path / "cache")
    for config, data in ((there, b"from the emulator"), (elsewhere, b"from elsewhere")):
        with ObjectDataset(config, ["k.bin"], cache=cache) as ds:
            assert bytes(ds[0]) == data
    assert len(recorder.seen) == 1  # a miss there, not the other endpoint's entry


def test_a_large_object_is_read_in_ranged_parts_checked_once_assembled(
    gcs_server, gcs_bucket, gcs_proxy
):
    data = random.Random(11).randbytes(700_000)
    gcs_server.put_object(gcs_bucket, "large/blob.bin", data)
    # A corrupted part is caught by the whole object's x-goog-hash, once assembled.
    proxy = gcs_proxy(faults=FaultPlan(seed=3, corrupt=0.2))
    config = gcs_server.store_config(gcs_bucket, "large", endpoint_url=proxy.endpoint_url)
    parts = PartsConfig(part_size=100_000, parts_in_flight=3)
    fetch = FetchConfig(retry=RetryConfig(max_attempts=10, base_delay=0.01, max_delay=0.05))
    with ObjectDataset(config, parts=parts, fetch_config=fetch) as ds:  # listed: size known
        assert list(ds.keys) == ["blob.bin"]
        got = [bytes(body) for body in ConcurrentDataLoader(ds, batch_size=None)]
    assert got == [data]
    stats = proxy.stats()
    assert stats["faults"]["corrupt"] > 0
    # the listing, then 7 ranged parts and a check for growth, per attempt
    assert stats["requests_by_method"]["GET"] >= 1 + 7 + 1


#: 503s (S3-shaped: a GCS client goes by the status), resets, truncated and corrupted bodies
FAULTS = FaultPlan(seed=41, slowdown_503=0.1, reset_before=0.05, truncate=0.05, corrupt=0.05)
FETCH = FetchConfig(
    timeouts=Timeouts(connect=2, first_byte=2, read=1),
    retry=RetryConfig(max_attempts=8, base_delay=0.01, max_delay=0.1, throttle_base_delay=0.02),
)


@pytest.mark.parametrize(
    "proxy_options,fetch,check",
    [
        ({"faults": FAULTS}, FETCH, "faults"),
        (
            {"latency_ms": 2, "straggler_fraction": 0.1, "straggler_s": 2.0},
            dataclasses.replace(FETCH, hedge=HedgeConfig(min_delay=0.05, max_delay=0.2)),
            "hedges",
        ),
    ],
    ids=["retried-faults", "hedged-stragglers"],
)
def test_faults_are_retried_and_stragglers_hedged_every_sample_intact(
    gcs_server, gcs_bucket, gcs_proxy, proxy_options, fetch, check
):
    rng = random.Random(5)
    objects = {f"{i:03d}.bin": rng.randbytes(rng.randint(2_000, 20_000)) for i in range(150)}
    for key, data in objects.items():
        gcs_server.put_object(gcs_bucket, "faults/" + key, data)
    proxy = gcs_proxy(**proxy_options)
    config = gcs_server.store_config(gcs_bucket, "faults", endpoint_url=proxy.endpoint_url)
    ds = ObjectDataset(config, sorted(objects), decode=sha256_hex, fetch_config=fetch)
    loader = ConcurrentDataLoader(ds, batch_size=16, num_workers=2)
    got = [digest for batch in loader for digest in batch]
    assert got == [sha256_hex(objects[k]) for k in sorted(objects)]
    stats = loader.stats()
    if check == "faults":
        faults = proxy.stats()["faults"]
        assert all(
            faults.get(n, 0) > 0 for n in ("slowdown_503", "reset_before", "truncate", "corrupt")
        ), faults
        assert stats["throttles"] > 0 and stats["retries"] > 0, stats
    else:
        assert stats["hedges"] > 0 and stats["hedges_won"] > 0, stats


def test_a_throttle_storm_answered_with_retry_after_is_waited_out(
    gcs_server, gcs_bucket, gcs_proxy
):
    objects = {f"{i:02d}.bin": bytes([i]) * 1000 for i in range(10)}
    for key, data in objects.items():
        gcs_server.put_object(gcs_bucket, "storm/" + key, data)
    wait_s = 0.8
    proxy = gcs_proxy(faults=FaultPlan(storm_seconds=0.3, retry_after_s=wait_s))
    config = gcs_server.store_config(gcs_bucket, "storm", endpoint_url=proxy.endpoint_url)
    # Backoff alone would retry every 10 ms, about 30 times per object within the storm.
    fetch = FetchConfig(retry=RetryConfig(throttle_base_delay=0.01, throttle_max_delay=0.01))
    ds = ObjectDataset(config, sorted(objects), fetch_config=fetch)
    started = time.monotonic()
    got = [bytes(body) for batch in ConcurrentDataLoader(ds, batch_size=10) for body in batch]
    assert got == [objects[k] for k in sorted(objects)]
    assert time.monotonic() - started >= wait_s
    assert 0 < proxy.stats()["storm_503"] <= len(objects)  # each object asked to wait once


def test_pack_from_gcs_then_shards_on_gcs_read_with_readahead(
    gcs_server, gcs_images, gcs_env, tmp_path
):
    root, files = gcs_images
    local = tmp_path / "shards"
    assert main(["pack", root, str(local), "--shard-size", "40000", "--image-folder"]) == 0
    gcs_server.upload_dir(local, BUCKET, "shards/")
    with ShardDataset(local) as reference:
        want = reference.__getitems__(list(range(len(reference))))
    with ShardDataset(
        f"gs://{BUCKET}/shards/", readahead=Readahead(span_bytes=32_768, max_bytes=262_144)
    ) as ds:
        assert ds.shards == reference.shards and len(ds) == len(files)
        got = ds.__getitems__(list(range(len(ds))))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want]
    for mine, theirs in zip(got, want, strict=True):
        assert {k: v for k, v in mine.items() if not k.startswith("__")} == {
            k: v for k, v in theirs.items() if not k.startswith("__")
        }


def test_cli_inspect_and_cache_warm_read_gcs(gcs_images, gcs_env, tmp_path, capsys):
    root, files = gcs_images
    assert main(["inspect", root, "--image-folder", "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["root"], report["objects"], report["images"]) == (root, len(files), len(files))
    cache = str(tmp_path / "cache")
    assert main(["cache", "warm", root, "--cache", cache, "--no-progress"]) == 0
    assert f"read {len(files)} objects" in capsys.readouterr().err
    assert main(["cache", "info", cache, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == len(files)


def test_a_missing_object_is_an_error_naming_its_gs_url(gcs_images, gcs_env):
    root, files = gcs_images
    ds = ObjectDataset(root, [files[0][0], "apple/missing.jpg"], decode=sha256_hex)
    with pytest.raises(ObjectNotFound) as caught:
        batches_of(ds, batch_size=2, num_workers=1)
    assert caught.value.url == f"{root}apple/missing.jpg"
    assert f"{root}apple/missing.jpg" in str(caught.value)
