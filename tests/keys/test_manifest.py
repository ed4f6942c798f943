"""Manifest keys round-trip exactly: what the CLI writes, from_manifest reads back as the same
keys, or the CLI refuses the key up front."""

from __future__ import annotations

import http.server

import pytest
from helpers import serve_http

from concurrent_loader import ObjectDataset
from concurrent_loader.cli import manifest_text
from concurrent_loader.errors import ConfigError, ObjectNotFound
from concurrent_loader.stores import store_config_for

# Characters str.splitlines() also splits on, and other awkward but valid key characters.
ODD_KEYS = [
    "plain/a.jpg",
    " leading space.jpg",
    "trailing space .jpg",
    "tab\there.jpg",
    *(f"split{c}here.bin" for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
    "unicode/日本語/ü.png",
    "a#hash-inside.bin",
    "percent%20and+plus.bin",
]


def test_every_writable_key_reads_back_exactly(tmp_path):
    store = store_config_for(str(tmp_path) + "/")
    path = tmp_path / "keys.txt"
    path.write_bytes(manifest_text(ODD_KEYS, store).encode("utf-8"))
    dataset = ObjectDataset.from_manifest(path, root=str(tmp_path) + "/")
    assert list(dataset.keys) == ODD_KEYS


def test_windows_line_endings_are_read_as_the_same_keys(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_bytes(b"a.bin\r\nb c.bin\r\n# comment\r\n\r\n")
    assert list(ObjectDataset.from_manifest(path).keys) == ["a.bin", "b c.bin"]


@pytest.mark.parametrize("key", ["two\nlines", "carriage\rreturn", "trailing\r", "   ", "", "#x"])
def test_keys_that_would_not_read_back_are_refused_naming_the_object(tmp_path, key):
    store = store_config_for(str(tmp_path) + "/")
    with pytest.raises(ConfigError, match="cannot be written to a line-based manifest") as caught:
        manifest_text(["fine.bin", key], store)
    assert caught.value.url == store.url_for(key)


class _ManifestAndObjects(http.server.BaseHTTPRequestHandler):
    FILES = {"/m/keys.txt": b"a.bin\r\n# a comment\nsub/b.bin\n", "/m/a.bin": b"A"}
    FILES["/m/sub/b.bin"] = b"BB"

    def do_GET(self) -> None:
        body = self.FILES.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: object) -> None:
        pass


def test_a_remote_manifest_is_read_and_its_folder_is_the_root():
    with serve_http(_ManifestAndObjects) as origin:
        dataset = ObjectDataset.from_manifest(f"{origin}/m/keys.txt")
        with dataset:
            assert list(dataset.keys) == ["a.bin", "sub/b.bin"]
            assert dataset.__getitems__([0, 1]) == [b"A", b"BB"]
        with pytest.raises(ObjectNotFound) as missing:
            ObjectDataset.from_manifest(f"{origin}/m/none.txt")
        assert missing.value.url == f"{origin}/m/none.txt"


def test_the_cli_writes_a_binary_form_that_reads_back_the_same_keys_and_sizes(tmp_path):
    from concurrent_loader.cli import main

    root = tmp_path / "root"
    names = [key for key in ODD_KEYS if "/" not in key] + ["sub/ü b.bin"]
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * i)
    manifest = tmp_path / "keys.txt"
    assert main(["manifest", str(root), "-o", str(manifest), "--no-progress"]) == 0
    text = ObjectDataset.from_manifest(manifest, root=str(root))
    binary = ObjectDataset.from_manifest(f"{manifest}.bin", root=str(root))
    assert list(binary.keys) == list(text.keys) == sorted(names)
    assert binary.source.sizes.tolist() == [names.index(k) for k in binary.keys]
    assert text.source.sizes is None
    assert binary[len(names) - 1] == text[len(names) - 1]


def test_a_manifest_that_is_not_utf8_or_a_damaged_binary_one_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a.bin\n\xff.bin\n")
    with pytest.raises(ConfigError, match="bad.txt cannot be read"):
        ObjectDataset.from_manifest(bad)
    good = tmp_path / "good.txt"
    good.write_bytes(b"a.bin\n")
    ObjectDataset.from_manifest(good).keys.save(tmp_path / "cut.bin")
    (tmp_path / "cut.bin").write_bytes((tmp_path / "cut.bin").read_bytes()[:40])
    with pytest.raises(ConfigError, match="cut.bin cannot be read"):
        ObjectDataset.from_manifest(tmp_path / "cut.bin")
