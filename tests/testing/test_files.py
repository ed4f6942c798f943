"""The plain HTTP file server: serves a directory on loopback, ranges, 404 outside it, stops."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from concurrent_loader import ObjectDataset
from concurrent_loader.testing.files import FileServer


def test_serves_files_ranges_and_refuses_paths_outside(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"0123456789")
    (tmp_path.parent / "secret.txt").write_text("no")
    with FileServer(tmp_path, processes=2) as server:
        assert server.endpoint_url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{server.endpoint_url}/a/x.bin") as r:
            assert r.read() == b"0123456789"
        ranged = urllib.request.Request(
            f"{server.endpoint_url}/a/x.bin", headers={"Range": "bytes=2-4"}
        )
        with urllib.request.urlopen(ranged) as r:
            assert r.status == 206 and r.read() == b"234"
        for path in ("/a/missing", "/%2e%2e/secret.txt", "/a"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(f"{server.endpoint_url}{path}")
            assert info.value.code == 404
            info.value.close()
        dataset = ObjectDataset(f"{server.endpoint_url}/a/", keys=["x.bin"])
        try:
            assert dataset[0] == b"0123456789"
        finally:
            dataset.close()
        pids = [child.pid for child in server._children]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
