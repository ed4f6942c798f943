"""Checking a body against the checksum its store gave for it.

:func:`s3_checksum` and :func:`http_checksum` pick the cheapest checksum of a response;
:meth:`Checksum.check` raises :class:`~concurrent_loader.errors.IntegrityError` (retried) on
a mismatch. :meth:`Checksum.running` gives the same check as a :class:`RunningChecksum`,
fed the body piece by piece as it arrives (the transport's ``digest_for``), while the bytes
are still in the CPU's cache: every algorithm here can (CRCs continue from the previous
value, hashes ``update``), and gives the digest of the whole body. What is checked:

* S3: ``x-amz-checksum-*`` (crc64nvme, crc32c, crc32, sha1, sha256; not ``COMPOSITE``), on
  a range that part's; opt-in, a single-part ETag as the MD5.
* HTTP(S): GCS's ``x-goog-hash`` and ``Content-MD5`` (not when GCS decoded a gzip object).
* A whole-object checksum sent with a part is checked once the parts are assembled.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anycrc

from ..errors import IntegrityError, Reason

__all__ = [
    "ALGORITHMS",
    "Checksum",
    "RunningChecksum",
    "covers_whole_object",
    "http_checksum",
    "s3_checksum",
]

Data = bytes | bytearray | memoryview


_SIZES = {"crc64nvme": 8, "crc32c": 4, "crc32": 4, "sha1": 20, "sha256": 32, "md5": 16}
# anycrc's calc(data, init) continues a CRC from the value of the bytes before ``data``.
_CRC_MODELS = {"crc64nvme": "CRC64-NVME", "crc32c": "CRC32C", "crc32": "CRC32"}
_CALCS = {name: anycrc.Model(model).calc for name, model in _CRC_MODELS.items()}


def _digest(name: str) -> Callable[[Data], bytes]:
    calc, size = _CALCS.get(name), _SIZES[name]
    if calc is not None:
        return lambda data: int(calc(data, 0)).to_bytes(size, "big")
    return lambda data: hashlib.new(name, data).digest()


#: algorithm -> the digest of a body, cheapest first (``benchmarks/integrity.py``)
ALGORITHMS: dict[str, Callable[[Data], bytes]] = {name: _digest(name) for name in _SIZES}


@dataclass(frozen=True, slots=True)
class Checksum:
    """A store's digest: ``algorithm`` (of :data:`ALGORITHMS`), raw ``expected``, its header."""

    algorithm: str
    expected: bytes
    source: str

    def _render(self, digest: bytes) -> str:
        # In the spelling of the header, so the message can be compared with it.
        if self.source == "etag":
            return digest.hex()
        return base64.b64encode(digest).decode("ascii")

    def check(self, data: Data, url: str) -> None:
        """Raise ``IntegrityError`` naming ``url`` unless ``data`` has this digest."""
        got = ALGORITHMS[self.algorithm](data)
        if got != self.expected:
            raise self._mismatch(got, len(data), url)

    def running(self) -> RunningChecksum:
        """A fresh check of this digest over a body fed in order (one per response)."""
        calc = _CALCS.get(self.algorithm)
        if calc is not None:
            return _RunningCrc(self, calc)
        return _RunningHash(self)

    def _mismatch(self, got: bytes, length: int, url: str) -> IntegrityError:
        return IntegrityError(
            f"{self.algorithm} of the {length} bytes received is {self._render(got)}, "
            f"the store's {self.source} says {self._render(self.expected)}",
            url=url,
            stage="fetch",
            cause=Reason.CHECKSUM_MISMATCH,
        )


class RunningChecksum:
    """A :class:`Checksum` computed over a body fed in order (``update``: a transport's
    ``BodyDigest``); :meth:`check` once the whole body was fed."""

    __slots__ = ("checksum", "length")

    def __init__(self, checksum: Checksum) -> None:
        self.checksum = checksum
        self.length = 0  # bytes fed

    def update(self, data: memoryview, /) -> None:
        raise NotImplementedError

    def digest(self) -> bytes:
        """The digest of the bytes fed so far."""
        raise NotImplementedError

    def check(self, url: str) -> None:
        """Raise ``IntegrityError`` naming ``url`` unless the bytes fed have the digest."""
        got = self.digest()
        if got != self.checksum.expected:
            raise self.checksum._mismatch(got, self.length, url)


class _RunningCrc(RunningChecksum):
    __slots__ = ("_calc", "_value")

    def __init__(self, checksum: Checksum, calc: Callable[[Data, int], int]) -> None:
        self.checksum = checksum  # not through super(): one per GET
        self.length = 0
        self._calc = calc
        self._value = 0  # the CRC of no bytes, for every model here

    def update(self, data: memoryview, /) -> None:
        self._value = self._calc(data, self._value)
        self.length += len(data)

    def digest(self) -> bytes:
        return int(self._value).to_bytes(_SIZES[self.checksum.algorithm], "big")


class _RunningHash(RunningChecksum):
    __slots__ = ("_hash",)

    def __init__(self, checksum: Checksum) -> None:
        super().__init__(checksum)
        self._hash = hashlib.new(checksum.algorithm)

    def update(self, data: memoryview, /) -> None:
        self._hash.update(data)
        self.length += len(data)

    def digest(self) -> bytes:
        return self._hash.digest()


def _from_base64(algorithm: str, value: str, source: str) -> Checksum | None:
    """The checksum in a base64 header value; None for a composite or malformed one."""
    try:
        digest = binascii.a2b_base64(value.strip(), strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    if len(digest) != _SIZES[algorithm]:
        return None
    return Checksum(algorithm, digest, source)


_S3_HEADERS = tuple((name, "x-amz-checksum-" + name) for name in ALGORITHMS if name != "md5")


def s3_checksum(headers: Mapping[str, str], *, etag_md5: bool) -> Checksum | None:
    """An S3 response's full-object ``x-amz-checksum-*``, cheapest first; else, when
    ``etag_md5``, a single-part ETag as the MD5; else None."""
    if headers.get("x-amz-checksum-type", "").upper() != "COMPOSITE":
        for algorithm, name in _S3_HEADERS:
            value = headers.get(name)
            if value is not None:
                checksum = _from_base64(algorithm, value, name)
                if checksum is not None:
                    return checksum
    if etag_md5:
        etag = headers.get("etag", "").removeprefix("W/").strip('"')
        if len(etag) == 32:
            try:
                return Checksum("md5", bytes.fromhex(etag), "etag")
            except ValueError:
                return None
    return None


def http_checksum(headers: Mapping[str, str], *, whole: bool) -> Checksum | None:
    """GCS's ``x-goog-hash`` (the whole object's, also on a range), crc32c first; else, for
    a whole body, ``Content-MD5``; else None."""
    if _transcoded(headers):
        return None
    found: dict[str, Checksum] = {}
    for item in headers.get("x-goog-hash", "").split(","):
        algorithm, _, value = item.strip().partition("=")
        algorithm = algorithm.lower()
        if algorithm in ("crc32c", "md5") and algorithm not in found:
            checksum = _from_base64(algorithm, value, "x-goog-hash")
            if checksum is not None:
                found[algorithm] = checksum
    if "crc32c" in found:
        return found["crc32c"]
    if "md5" in found:
        return found["md5"]
    content_md5 = headers.get("content-md5")
    if whole and content_md5 is not None:
        return _from_base64("md5", content_md5, "content-md5")
    return None


def _transcoded(headers: Mapping[str, str]) -> bool:
    """Whether GCS decompressed a stored gzip object, so its hashes are not the body's."""
    stored = headers.get("x-goog-stored-content-encoding", "identity").strip().lower()
    sent = headers.get("content-encoding", "identity").strip().lower()
    return stored != "identity" and stored != sent


def covers_whole_object(headers: Mapping[str, str]) -> bool:
    """Whether a ``206``'s ``Content-Range`` (``bytes 0-(n-1)/n``) is the whole object."""
    value = headers.get("content-range", "")
    unit, _, rest = value.strip().partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if unit.lower() != "bytes" or not (first.isdigit() and last.isdigit() and total.isdigit()):
        return False
    return int(first) == 0 and int(last) + 1 == int(total)
