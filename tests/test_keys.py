import pickle

import pytest

from concurrent_loader.keys import KeyTable


def test_roundtrip_unicode_and_empty():
    keys = ["a/b.jpg", "ünïcødé/ß.png", "", "x" * 300]
    table = KeyTable(keys)
    assert list(table) == keys and len(table) == 4
    assert table[-1] == keys[-1] and table[1:3] == keys[1:3]
    assert list(pickle.loads(pickle.dumps(table))) == keys
    with pytest.raises(IndexError):
        table[4]
