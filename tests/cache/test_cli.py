"""``concurrent-loader cache warm | info | clear`` against the real local S3 server."""

from __future__ import annotations

import json
import random

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.cli import main
from concurrent_loader.stores import S3Config

PREFIX = "cache/cli/"


def test_warm_then_train_with_no_get_then_clear(
    s3_server, s3_bucket, s3_env, proxy_factory, cache_dir, tmp_path, capsys
):
    rng = random.Random(7)
    objects = {f"{i:03d}.bin": rng.randbytes(rng.randint(100, 3000)) for i in range(30)}
    client = s3_server.client()
    try:
        for key, data in objects.items():
            client.put_object(Bucket=s3_bucket, Key=PREFIX + key, Body=data)
    finally:
        client.close()
    proxy = proxy_factory()
    root = f"s3://{s3_bucket}/{PREFIX}"
    manifest = tmp_path / "keys.txt"
    manifest.write_text("".join(f"{k}\n" for k in sorted(objects)[:20]))

    args = ["--endpoint-url", proxy.endpoint_url, "--cache", str(cache_dir), "--no-progress"]
    assert main(["cache", "warm", root, "--manifest", str(manifest), *args]) == 0
    assert "read 20 objects" in capsys.readouterr().err
    assert main(["cache", "warm", root, *args]) == 0  # listing: all 30, 20 of them cached
    err = capsys.readouterr().err
    assert "read 30 objects" in err and "20 already cached" in err

    assert main(["cache", "info", str(cache_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 30 and info["hits"] == 20 and info["misses"] == 30

    proxy.reset_stats()
    dataset = ObjectDataset(
        S3Config.from_url(root, endpoint_url=proxy.endpoint_url),
        keys=sorted(objects),
        cache=str(cache_dir),
    )
    got = [bytes(body) for batch in ConcurrentDataLoader(dataset, batch_size=10) for body in batch]
    assert got == [objects[k] for k in sorted(objects)]
    assert proxy.stats()["requests_by_method"].get("GET", 0) == 0

    assert main(["cache", "info", str(cache_dir)]) == 0
    assert "entries:    30" in capsys.readouterr().out
    assert main(["cache", "clear", str(cache_dir)]) == 0
    assert "removed 30 entries" in capsys.readouterr().err
    assert main(["cache", "info", str(cache_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0


def test_info_and_clear_refuse_a_directory_that_is_not_a_cache(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["cache", "clear", str(tmp_path)]) == 1
    assert "not a cache directory" in capsys.readouterr().err
    assert main(["cache", "info", str(tmp_path)]) == 1
    assert (tmp_path / "precious.txt").exists()


def test_warm_needs_a_root_or_a_manifest(cache_dir, capsys):
    assert main(["cache", "warm", "--cache", str(cache_dir)]) == 1
    assert "ROOT or --manifest" in capsys.readouterr().err
