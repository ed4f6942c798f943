"""Azure Blob Storage end to end against Azurite: the datasets, the loader, the node cache,
read-ahead, ranged parts, retries and hedges through the fault proxy, the command line, and
the credentials the service accepts or refuses. Every check is on the samples' identity
(their bytes or pixels against the same files on disk), not only their count."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json

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
from concurrent_loader.cache import CacheConfig
from concurrent_loader.cli import main
from concurrent_loader.errors import (
    AccessDenied,
    BucketNotFound,
    IntegrityError,
    ObjectNotFound,
    Throttled,
)
from concurrent_loader.stores.azure import AzureConfig, SharedKey
from concurrent_loader.streaming import ShardOrderSampler
from concurrent_loader.testing import FaultPlan

from .conftest import BLOBS, IMAGES, through

NO_HEDGES = FetchConfig(hedge=HedgeConfig(enabled=False))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def gets(proxy) -> int:
    return int(proxy.stats()["requests_by_method"].get("GET", 0))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_folder_gives_the_pixels_of_the_same_folder_on_disk(
    azure_images, azure_env, num_workers
):
    local_root, _ = azure_images
    remote, local = (
        ImageFolder("az://images/train/", image_size=32),
        ImageFolder(str(local_root), image_size=32),
    )
    assert remote.classes == local.classes and len(remote) == len(local)
    order = torch.randperm(len(local), generator=torch.Generator().manual_seed(3)).tolist()
    loaders = [
        ConcurrentDataLoader(
            ds,
            batch_size=5,
            sampler=order,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )
        for ds, workers in ((remote, num_workers), (local, 0))
    ]
    for (images, labels), (want_images, want_labels) in zip(*loaders, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_object_dataset_by_listing_by_a_manifest_on_disk_and_one_in_the_container(
    azure_blobs, azurite_server, azure_env, tmp_path
):
    by_key = dict(zip(azure_blobs.keys, azure_blobs.digests, strict=True))
    with ObjectDataset("az://blobs/small/", decode=sha256_hex) as listed:
        got = listed.__getitems__(list(range(len(listed))))
    assert sorted(zip(listed.keys, got, strict=True)) == sorted(
        (key.removeprefix("small/"), digest) for key, digest in by_key.items()
    )
    manifest = tmp_path / "manifest.txt"
    assert main(["manifest", "az://blobs/small/", "-o", str(manifest), "--no-progress"]) == 0
    azurite_server.put_object(BLOBS, "small-manifest.txt", manifest.read_bytes())
    for source in (str(manifest), "az://blobs/small-manifest.txt"):
        with ObjectDataset.from_manifest(source, "az://blobs/small/", decode=sha256_hex) as ds:
            assert [by_key["small/" + k] for k in ds.keys] == [ds[i] for i in range(len(ds))]
            assert len(ds) == len(by_key)


def test_cli_inspect_and_cache_warm_then_a_second_epoch_takes_no_get(
    azure_blobs, azurite_server, azure_env, azure_proxy, tmp_path, capsys, monkeypatch
):
    assert main(["inspect", "az://blobs/small/", "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["root"] == "az://blobs/small/" and report["objects"] == len(azure_blobs.keys)

    proxy = azure_proxy()
    endpoint = through(proxy, azurite_server)
    root = azurite_server.store_config(BLOBS, "small/", endpoint)
    keys = [key.removeprefix("small/") for key in azure_blobs.keys]
    cache = CacheConfig(str(tmp_path / "cache"), max_bytes=10**8)
    with ObjectDataset(root, keys, decode=sha256_hex, cache=cache, fetch_config=NO_HEDGES) as ds:
        loader = ConcurrentDataLoader(ds, batch_size=16)
        for epoch in range(2):
            proxy.reset_stats()
            assert [d for batch in loader for d in batch] == azure_blobs.digests
            assert gets(proxy) == (len(keys) if epoch == 0 else 0), epoch

    # cache warm from the command line (its endpoint, from the connection string, the
    # proxy: entries are per endpoint) fills a new cache; a dataset then sends no GET.
    string = azurite_server.connection_string.replace(azurite_server.endpoint_url, endpoint)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", string)
    warmed = str(tmp_path / "warmed")
    proxy.reset_stats()
    assert main(["cache", "warm", "az://blobs/small/", "--cache", warmed, "--no-progress"]) == 0
    assert gets(proxy) >= len(keys)  # and its listing, and any hedge
    proxy.reset_stats()
    with ObjectDataset(root, keys, decode=sha256_hex, cache=CacheConfig(warmed)) as ds:
        assert ds.__getitems__(list(range(len(ds)))) == azure_blobs.digests
    assert gets(proxy) == 0


def test_a_large_blob_is_read_in_ranged_parts(azure_blobs, azurite_server, azure_proxy):
    proxy = azure_proxy()
    root = azurite_server.store_config(BLOBS, "large/", through(proxy, azurite_server))
    part = 512 * 1024
    parts = PartsConfig(part_size=part, parts_in_flight=3)
    with ObjectDataset(root, parts=parts, fetch_config=NO_HEDGES) as ds:  # listed: sizes known
        proxy.reset_stats()
        [[body]] = list(ConcurrentDataLoader(ds, batch_size=1, collate_fn=list))
    assert bytes(body) == azure_blobs.large
    # One GET per part, and one for the byte past the listed size: none there (416).
    assert gets(proxy) == -(-len(azure_blobs.large) // part) + 1


@pytest.mark.parametrize("parts", [None, PartsConfig(part_size=2**20)], ids=["whole", "parts"])
def test_a_corrupted_body_fails_the_blobs_md5(azure_blobs, azurite_server, azure_proxy, parts):
    proxy = azure_proxy(faults=FaultPlan(corrupt=1.0))
    root = azurite_server.store_config(BLOBS, "large/", through(proxy, azurite_server))
    config = FetchConfig(retry=RetryConfig(max_attempts=2, base_delay=0.0), hedge=NO_HEDGES.hedge)
    with (
        ObjectDataset(root, parts=parts, fetch_config=config) as ds,
        pytest.raises(IntegrityError, match="md5") as raised,
    ):
        list(ConcurrentDataLoader(ds, batch_size=1, collate_fn=list))
    assert raised.value.url == "az://blobs/large/one.bin"


def test_every_sample_arrives_once_intact_in_order_through_faults(
    azure_blobs, azurite_server, azure_proxy
):
    plan = FaultPlan(
        seed=41,
        throttle_code="ServerBusy",  # Azure's answer: 503 ServerBusy
        slowdown_503=0.08,
        error_500=0.04,
        reset_before=0.03,
        reset_mid_body=0.03,
        truncate=0.03,
    )
    proxy = azure_proxy(faults=plan, latency_ms=1)
    root = azurite_server.store_config(BLOBS, "small/", through(proxy, azurite_server))
    config = FetchConfig(
        timeouts=Timeouts(connect=2, first_byte=5, read=2),
        retry=RetryConfig(max_attempts=8, base_delay=0.01, max_delay=0.2, throttle_base_delay=0.05),
    )
    keys = [key.removeprefix("small/") for key in azure_blobs.keys]
    ds = ObjectDataset(root, keys, decode=sha256_hex, fetch_config=config)
    order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(9)).tolist()
    loader = ConcurrentDataLoader(ds, batch_size=10, sampler=order, num_workers=2)
    batches = [list(batch) for batch in loader]
    assert batches == [
        [azure_blobs.digests[i] for i in order[j : j + 10]] for j in range(0, len(order), 10)
    ]
    faults, stats = proxy.stats()["faults"], loader.stats()
    for name in ("slowdown_503", "error_500", "reset_before", "truncate"):
        assert faults.get(name, 0) > 0, f"the proxy never injected {name}: {faults}"
    assert stats["throttles"] > 0 and stats["retries"] > 0, stats


def test_a_server_busy_answer_is_a_throttle_with_the_services_code_and_retry_after(
    azure_blobs, azurite_server, azure_proxy
):
    plan = FaultPlan(slowdown_503=1.0, throttle_code="ServerBusy", retry_after_s=3)
    proxy = azure_proxy(faults=plan)
    root = azurite_server.store_config(BLOBS, "small/", through(proxy, azurite_server))

    async def one_get() -> None:
        store = root.open(FetchConfig())
        try:
            await store.get("0000.bin")
        finally:
            await store.close()

    with pytest.raises(Throttled) as busy:
        asyncio.run(one_get())
    assert busy.value.code == "ServerBusy" and busy.value.status == 503
    assert busy.value.url == "az://blobs/small/0000.bin" and busy.value.retryable
    assert busy.value.retry_after == 3.0


def test_hedges_win_over_stragglers(azure_blobs, azurite_server, azure_proxy):
    proxy = azure_proxy(latency_ms=1, straggler_fraction=0.1, straggler_s=2.0)
    root = azurite_server.store_config(BLOBS, "small/", through(proxy, azurite_server))
    config = FetchConfig(hedge=HedgeConfig(max_delay=0.3))
    keys = [key.removeprefix("small/") for key in azure_blobs.keys]
    with ObjectDataset(root, keys, decode=sha256_hex, fetch_config=config) as ds:
        loader = ConcurrentDataLoader(ds, batch_size=20)
        assert [d for batch in loader for d in batch] == azure_blobs.digests
        stats = loader.stats()
    assert stats["hedges"] > 0 and stats["hedges_won"] > 0, stats


def test_shards_packed_from_azure_read_back_from_azure_with_readahead(
    azure_images, azurite_server, azure_env, tmp_path
):
    out = tmp_path / "shards"
    assert (
        main(
            [
                "pack",
                "az://images/train/",
                str(out),
                "--image-folder",
                "--shard-size",
                "40KB",
                "--no-progress",
            ]
        )
        == 0
    )
    azurite_server.upload_dir(out, IMAGES, prefix="shards/")
    span = Readahead(span_bytes=16 * 1024, max_bytes=2**22)
    with ShardDataset(str(out)) as local, ShardDataset("az://images/shards/", readahead=span) as ds:
        assert ds.shards == local.shards and len(ds.shards) > 1 and len(ds) == len(local)
        expected = {s["__key__"]: s for s in local.__getitems__(list(range(len(local))))}
        sampler = ShardOrderSampler(ds.shard_lengths, buffer_size=8, seed=3)
        loader = ConcurrentDataLoader(ds, batch_size=4, sampler=sampler, collate_fn=list)
        samples = [sample for batch in loader for sample in batch]
    assert sorted(s["__key__"] for s in samples) == sorted(expected)
    for sample in samples:
        want = expected[sample["__key__"]]
        assert {k: v for k, v in sample.items() if not k.startswith("__")} == {
            k: v for k, v in want.items() if not k.startswith("__")
        }


def test_errors_name_the_blob_or_container_and_carry_the_services_code(azure_images, azure_env):
    with (
        ImageFolder("az://images/train/", keys=["apple/missing.jpg"]) as ds,
        pytest.raises(ObjectNotFound) as missing,
    ):
        ds[0]
    assert missing.value.url == "az://images/train/apple/missing.jpg"
    assert missing.value.code == "BlobNotFound" and "BlobNotFound" in str(missing.value)
    with pytest.raises(BucketNotFound) as no_container:
        ObjectDataset("az://no-such-container/x/")
    assert no_container.value.code == "ContainerNotFound"
    assert "az://no-such-container/x/" in str(no_container.value)


def test_shared_key_and_sas_are_accepted_and_a_wrong_key_or_right_is_refused(
    azure_blobs, azurite_server
):
    sas = azurite_server.sas_token(BLOBS)
    for root in (
        azurite_server.store_config(BLOBS, "small/"),
        azurite_server.store_config(BLOBS, "small/", sas_token=sas),
        AzureConfig.from_url(
            "az://blobs/small/", connection_string=azurite_server.connection_string
        ),
    ):
        with ObjectDataset(root, decode=sha256_hex) as ds:  # a listing, then GETs
            assert sorted(ds.__getitems__(list(range(len(ds))))) == sorted(azure_blobs.digests)

    wrong = dataclasses.replace(
        azurite_server.store_config(BLOBS, "small/"), credential=SharedKey("d3Jvbmcga2V5")
    )
    with ObjectDataset(wrong, ["0000.bin"]) as ds, pytest.raises(AccessDenied) as refused:
        ds[0]
    assert refused.value.code in ("AuthenticationFailed", "AuthorizationFailure")
    assert refused.value.status == 403 and "d3Jvbmcga2V5" not in str(refused.value)

    sas_of_another = azurite_server.sas_token(IMAGES)  # signed for another container
    with pytest.raises(AccessDenied):
        ObjectDataset(azurite_server.store_config(BLOBS, "small/", sas_token=sas_of_another))


def test_a_manifest_in_the_container_is_read_with_the_roots_account_and_key(
    azure_blobs, azurite_server, monkeypatch
):
    """The environment names another account on a loopback port nothing listens on; the
    manifest goes where the root's config says, signed with the root's key."""
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=http;AccountName=other;AccountKey=c29tZW9uZSBlbHNl;"
        "BlobEndpoint=http://127.0.0.1:9/other",
    )
    keys = [k.removeprefix("small/") for k in azure_blobs.keys]
    azurite_server.put_object(BLOBS, "manifests/root-options.txt", "\n".join(keys).encode())
    root = azurite_server.store_config(BLOBS, "small/")
    with ObjectDataset.from_manifest(
        "az://blobs/manifests/root-options.txt", root, decode=sha256_hex
    ) as ds:
        assert list(ds.keys) == keys


def test_a_prefix_with_a_percent_sign_is_listed(azurite_server):
    """Shared Key signs query values as they are (a ``%41`` in a prefix is not an ``A``)."""
    azurite_server.put_object(BLOBS, "pct%41/one.bin", b"1")
    azurite_server.put_object(BLOBS, "pctA/other.bin", b"2")
    with ObjectDataset(azurite_server.store_config(BLOBS, "pct%41/")) as ds:
        assert list(ds.keys) == ["one.bin"] and ds[0] == b"1"
