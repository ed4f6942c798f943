"""Manifest keys round-trip exactly: what the CLI writes, from_manifest reads back as the same
keys, or the CLI refuses the key up front."""

from __future__ import annotations

import pytest

from concurrent_loader import ObjectDataset
from concurrent_loader.cli import manifest_text
from concurrent_loader.errors import ConfigError
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
