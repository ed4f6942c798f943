"""The HTTP/1.1 framing logic alone, fed bytes directly: no socket, no event loop."""

from __future__ import annotations

import random

import pytest

from concurrent_loader.transport.parser import (
    CHUNKED,
    INTERIM,
    MAX_CHUNK_LINE,
    MAX_HEAD_BYTES,
    UNTIL_CLOSE,
    BodyTooLarge,
    ChunkedDecoder,
    FramingError,
    ProtocolError,
    RangeIgnored,
    UnsupportedEncoding,
    check_partial,
    check_partial_length,
    parse_content_length,
    parse_head,
)


def parse(data: bytes) -> tuple[int, dict[str, str], bool, int, int] | None:
    buffer = bytearray(data)
    return parse_head(buffer, 0, len(buffer))


# -- parse_head ---------------------------------------------------------------------------


def test_head_fields_and_body_start() -> None:
    data = b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: "x"\r\n\r\nhello'
    assert parse(data) == (200, {"content-length": "5", "etag": '"x"'}, True, 5, len(data) - 5)


def test_header_names_lower_cased_and_repeats_joined() -> None:
    head = parse(b"HTTP/1.1 404 Nope\r\nX-Dup: a\r\nx-dup:  b \r\nContent-Length: 0\r\n\r\n")
    assert head is not None
    assert head[1] == {"x-dup": "a, b", "content-length": "0"}


def test_incomplete_head_waits_for_more_from_where_it_stopped() -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    buffer = bytearray(len(data))
    searched = 0
    for end in range(1, len(data) + 1):
        buffer[end - 1] = data[end - 1]
        search_from = max(0, searched - 3)  # as the connection does: the end may straddle
        head = parse_head(buffer, search_from, end)
        searched = end
        if head is not None:
            break
    assert head is not None and end == len(data) - 3
    assert head[3:] == (3, len(data) - 3)


def test_only_the_bytes_up_to_end_count() -> None:
    buffer = bytearray(b"HTTP/1.1 200 OK\r\n\r\n" + bytes(100))
    assert parse_head(buffer, 0, 10) is None


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: Keep-Alive, Close\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", True),
        # No length: the body ends with the connection, which can never be reused.
        (b"HTTP/1.1 200 OK\r\n\r\n", False),
    ],
)
def test_keep_alive(head: bytes, keep_alive: bool) -> None:
    parsed = parse(head)
    assert parsed is not None and parsed[2] is keep_alive


@pytest.mark.parametrize(
    ("head", "framing"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", 42),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\nContent-Length: 42\r\n\r\n", 42),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n", CHUNKED),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity, Chunked\r\n\r\n", CHUNKED),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\n", 3),
        (b"HTTP/1.1 200 OK\r\n\r\n", UNTIL_CLOSE),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 0),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n", 0),
        (b"HTTP/1.1 100 Continue\r\n\r\n", INTERIM),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", INTERIM),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", UNTIL_CLOSE),
        (b"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\n", 1),  # no reason phrase
    ],
)
def test_body_framing(head: bytes, framing: int) -> None:
    parsed = parse(head)
    assert parsed is not None and parsed[3] == framing


@pytest.mark.parametrize(
    "head",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n",  # latin-1 superscript digits: not a status
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb9\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
    ],
)
def test_malformed_heads(head: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse(head)


@pytest.mark.parametrize("coding", ["gzip", "gzip, chunked", "chunked, chunked", "br,chunked"])
def test_transfer_codings_other_than_chunked_are_refused(coding: str) -> None:
    with pytest.raises(UnsupportedEncoding, match="only chunked"):
        parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: %s\r\n\r\n" % coding.encode())


def test_head_size_is_bounded() -> None:
    buffer = bytearray(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: y\r\n" * (MAX_HEAD_BYTES // 10))
    assert parse_head(buffer, 0, MAX_HEAD_BYTES - 1) is None
    with pytest.raises(ProtocolError, match="over"):
        parse_head(buffer, 0, MAX_HEAD_BYTES)


def test_parse_content_length() -> None:
    assert parse_content_length("0") == 0
    assert parse_content_length("123") == 123
    assert parse_content_length("7 , 7") == 7
    for bad in ("", " ", "1.0", "+1", "1e3", "7, 8", "٣"):
        with pytest.raises(ProtocolError):
            parse_content_length(bad)


# -- ChunkedDecoder -----------------------------------------------------------------------


def chunked(body: bytes, sizes: list[int], trailer: bytes = b"") -> bytes:
    out, pos, i = [], 0, 0
    while pos < len(body):
        size = sizes[i % len(sizes)]
        out.append(b"%x;ext=1\r\n%s\r\n" % (len(body[pos : pos + size]), body[pos : pos + size]))
        pos += size
        i += 1
    return b"".join(out) + b"0\r\n" + trailer + b"\r\n"


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 4096, 1 << 20])
def test_chunked_body_in_pieces_of_any_size(piece: int) -> None:
    body = random.Random(piece).randbytes(20_000)
    data = chunked(body, [1, 10, 4000, 333], trailer=b"X-Trailer: yes\r\n")
    decoder = ChunkedDecoder()
    done = False
    for start in range(0, len(data), piece):
        assert not done
        done = decoder.feed(data[start : start + piece])
    assert done and not decoder.overrun
    assert decoder.body == body


def test_chunked_empty_body_and_bytes_after_it() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"0\r\n\r\n")
    assert decoder.body == b"" and not decoder.overrun
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK")
    assert decoder.body == b"abc" and decoder.overrun


def test_chunked_hex_sizes_are_case_insensitive() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"A\r\n0123456789\r\na ; name=value\r\n0123456789\r\n0\r\n\r\n")
    assert decoder.body == b"0123456789" * 2


@pytest.mark.parametrize(
    "data",
    [
        b"zz\r\n",
        b"-1\r\n",
        b"\r\n",
        b"3\r\nabcX\r\n",
        b"3\r\nabc\r\nnot-hex\r\n",
        b"1" * (MAX_CHUNK_LINE + 2),
    ],
)
def test_malformed_chunked_bodies(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(data)


def test_chunked_body_bound_is_checked_before_the_chunk_arrives() -> None:
    decoder = ChunkedDecoder(max_bytes=10)
    assert not decoder.feed(b"6\r\nabcdef\r\n")
    with pytest.raises(BodyTooLarge, match="max_bytes 10"):
        decoder.feed(b"5\r\n")  # 6 + 5 > 10, refused from the size line alone
    decoder = ChunkedDecoder(max_bytes=10)
    assert decoder.feed(b"6\r\nabcdef\r\n4\r\nghij\r\n0\r\n\r\n")
    assert decoder.body == b"abcdefghij"


# -- partial content ----------------------------------------------------------------------


def test_partial_content_accepted() -> None:
    for headers in (
        {"content-range": "bytes 10-19/100"},
        {"content-range": "bytes 10-19/*"},
        {"content-range": "Bytes 10-19/100"},
        {},
    ):
        check_partial(206, headers, 10, (10, 20))
        check_partial(206, headers, CHUNKED, (10, 20))  # length checked at the end
    check_partial_length(10, (10, 20))


@pytest.mark.parametrize("status", [200, 201, 203])
def test_a_whole_object_for_a_range_is_refused(status: int) -> None:
    for byte_range, framing in (((10, 20), 100), ((0, 10), 100), ((10, 20), 10)):
        with pytest.raises(RangeIgnored, match="no Content-Range") as info:
            check_partial(status, {}, framing, byte_range)
        assert info.value.status == status
        assert isinstance(info.value, FramingError)
    # Without a Content-Range, a body of unknown length may be the whole object.
    for framing in (CHUNKED, UNTIL_CLOSE):
        with pytest.raises(RangeIgnored, match="unknown length"):
            check_partial(status, {}, framing, (0, 10))


def test_a_200_holding_exactly_the_range_is_accepted() -> None:
    # rclone serve s3 answers a range with 200, its Content-Range and exactly those bytes.
    for headers in ({"content-range": "bytes 10-19/100"}, {"content-range": "bytes 10-19/*"}):
        check_partial(200, headers, 10, (10, 20))
        check_partial(200, headers, CHUNKED, (10, 20))  # length checked at the end
    # From byte 0, a Content-Length of the range's size is those bytes whatever the server
    # did (cut it, or the object is that long).
    check_partial(200, {}, 10, (0, 10))


@pytest.mark.parametrize(
    ("content_range", "length"),
    [
        ("bytes 0-99/100", 100),  # the whole object, said so
        ("bytes 10-19/100", 100),  # the range said, the whole object sent
        ("bytes 11-20/100", 10),
        ("bytes 10-19/15", 10),
    ],
)
def test_a_200_that_is_not_exactly_the_range_is_refused(content_range: str, length: int) -> None:
    with pytest.raises(ProtocolError):
        check_partial(200, {"content-range": content_range}, length, (10, 20))


@pytest.mark.parametrize(
    ("content_range", "length"),
    [
        ("bytes 11-20/100", 10),  # another range of the same size
        ("bytes 10-19/100", 11),  # the range asked for, with a body of another size
        ("bytes 10-14/15", 5),  # clamped at the end of a shorter object
        (None, 9),
        ("bytes 10-19/15", 10),  # a range past its own total
        ("bytes */100", 10),
        ("items 10-19/100", 10),
        ("bytes 10-19", 10),
        ("bytes 10-/100", 10),
        ("bytes -19/100", 10),
        ("bytes 10-19/abc", 10),
    ],
)
def test_another_range_or_length_is_refused(content_range: str | None, length: int) -> None:
    headers = {} if content_range is None else {"content-range": content_range}
    with pytest.raises(ProtocolError):
        check_partial(206, headers, length, (10, 20))


def test_a_multipart_answer_is_refused() -> None:
    headers = {"content-type": "multipart/byteranges; boundary=x"}
    with pytest.raises(ProtocolError, match="multipart"):
        check_partial(206, headers, UNTIL_CLOSE, (10, 20))


def test_a_partial_body_of_the_wrong_length_is_refused_at_its_end() -> None:
    for length in (0, 9, 11):
        with pytest.raises(ProtocolError, match=f"has {length}"):
            check_partial_length(length, (10, 20))
