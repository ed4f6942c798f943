"""ObjectSource (one object per sample) and CallDecoder (the user's decode function)."""

from __future__ import annotations

import numpy as np
import pytest

from concurrent_loader import FetchConfig
from concurrent_loader.errors import DecodeError, Reason
from concurrent_loader.keys import KeyTable
from concurrent_loader.sources import CallDecoder, ObjectSource, Read, SampleSource
from concurrent_loader.testing.memory import MemoryConfig

URL = "memory://test/a.bin"


def test_without_a_decode_function_items_are_the_bytes():
    assert CallDecoder(None)(0, bytearray(b"abc"), URL) == b"abc"
    assert type(CallDecoder(None)(0, bytearray(b"abc"), URL)) is bytes


def test_decode_function_gets_the_bytes():
    assert CallDecoder(len)(0, b"abcd", URL) == 4


def test_our_error_without_an_object_gets_the_objects_name():
    def decode(data: bytes | bytearray) -> None:
        error = DecodeError("truncated", stage="decode", cause=Reason.UNDECODABLE)
        error.add_note("from the user's decode")
        raise error from ValueError("inner")

    with pytest.raises(DecodeError) as caught:
        CallDecoder(decode)(0, b"", URL)
    error = caught.value
    assert error.url == URL and error.cause is Reason.UNDECODABLE and error.stage == "decode"
    assert "from the user's decode" in error.__notes__
    assert isinstance(error.__cause__, ValueError)


def test_our_error_naming_an_object_is_kept():
    original = DecodeError("bad", url="memory://test/other", cause=Reason.UNDECODABLE)

    def decode(data: bytes | bytearray) -> None:
        raise original

    with pytest.raises(DecodeError) as caught:
        CallDecoder(decode)(0, b"", URL)
    assert caught.value is original


def test_other_errors_become_decode_errors_naming_the_object():
    def decode(data: bytes | bytearray) -> None:
        raise KeyError("user bug")

    with pytest.raises(DecodeError) as caught:
        CallDecoder(decode)(0, b"", URL)
    assert caught.value.url == URL and isinstance(caught.value.__cause__, KeyError)


def test_one_read_per_sample_with_its_size_when_known():
    store = MemoryConfig({})
    keys = KeyTable(["a.bin", "d/b.bin"], {"sizes": np.array([3, 5])})
    sized = ObjectSource(store, keys, CallDecoder(None), FetchConfig())
    assert isinstance(sized, SampleSource)
    assert len(sized) == 2
    assert sized.reads(1) == (Read("d/b.bin", size=5),)
    assert sized.url_for(1) == "memory://test/d/b.bin"
    assert sized.decode(0, [b"xyz"]) == b"xyz"
    unsized = ObjectSource(store, KeyTable(["a.bin"]), CallDecoder(None), FetchConfig())
    assert unsized.reads(0) == (Read("a.bin"),)


def test_sizes_must_match_the_keys():
    with pytest.raises(ValueError, match="column 'sizes': 1 integers needed"):
        KeyTable(["a"], {"sizes": np.array([1, 2])})
