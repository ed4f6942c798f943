"""One ``ListObjectsV2`` page as the S3 store sends and reads it: the query (signed as
botocore signs it), and the answer's objects, prefixes and continuation, read as botocore
reads them (URL-decoded only when the server says it encoded them)."""

from __future__ import annotations

import pytest

from concurrent_loader.errors import ConnectionFailed, Reason
from concurrent_loader.stores.base import ObjectInfo
from concurrent_loader.stores.s3.listing import _plain_page, _tree_page, page_query, parse_page
from concurrent_loader.stores.s3.sigv4 import SigV4Signer
from tests.stores.s3.test_sigv4 import CREDENTIALS, FROZEN, botocore_headers

URL = "s3://b/root/"
NS = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def _page(body: str, ns: str = NS) -> bytes:
    head = '<?xml version="1.0" encoding="UTF-8"?>'
    return f"{head}<ListBucketResult{ns}>{body}</ListBucketResult>".encode()


def test_the_query_is_canonical() -> None:
    query = page_query("root/ü a+b/", delimited=True, token="1/x=+", max_keys=10)
    assert query == (
        "continuation-token=1%2Fx%3D%2B&delimiter=%2F&encoding-type=url&list-type=2"
        "&max-keys=10&prefix=root%2F%C3%BC%20a%2Bb%2F"
    )
    assert page_query("", delimited=False) == "encoding-type=url&list-type=2&prefix="


@pytest.mark.parametrize("credentials", CREDENTIALS)
def test_a_listing_query_is_signed_as_botocore_signs_it(
    monkeypatch: pytest.MonkeyPatch, credentials: object
) -> None:
    signer = SigV4Signer("eu-west-1")
    amz_date = FROZEN.strftime("%Y%m%dT%H%M%SZ")
    for prefix, token in [("", None), ("odd name+%/ünï/", "tok/en=="), ("a//b/", None)]:
        query = page_query(prefix, delimited=True, token=token, max_keys=1000)
        url = f"http://127.0.0.1:9000/my-bucket?{query}"
        expected = botocore_headers(monkeypatch, url, credentials, "eu-west-1", FROZEN)  # type: ignore[arg-type]
        ours = {
            name.lower(): value
            for name, value in signer.headers_for_get(
                "127.0.0.1:9000",
                "/my-bucket",
                credentials,
                amz_date=amz_date,
                query=query,  # type: ignore[arg-type]
            )
        }
        assert ours == expected


def test_objects_and_prefixes_relative_to_the_root_url_decoded_when_said() -> None:
    body = _page(
        "<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>next/1=</NextContinuationToken>"
        "<Contents><Key>root/a+b%2Bc.bin</Key><Size>12</Size></Contents>"
        "<Contents><Key>root/%C3%BC%25.bin</Key><Size>0</Size></Contents>"
        "<CommonPrefixes><Prefix>root/sub+dir/</Prefix></CommonPrefixes>"
    )
    level, token = parse_page(body, "root/", URL)
    assert level.objects == [ObjectInfo("a b+c.bin", 12), ObjectInfo("ü%.bin", 0)]
    assert level.prefixes == ["sub dir/"]
    assert level.truncated and token == "next/1="


@pytest.mark.parametrize("ns", [NS, ""])
def test_keys_are_taken_as_they_are_when_not_encoded(ns: str) -> None:
    body = _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>a+b%41</Key><Size>3</Size></Contents>",
        ns,
    )
    level, token = parse_page(body, "", URL)
    assert level.objects == [ObjectInfo("a+b%41", 3)]
    assert (level.prefixes, level.truncated, token) == ([], False, None)


@pytest.mark.parametrize(
    "body",
    [
        b"not xml at all",
        b"<Error><Code>InternalError</Code></Error>",
        _page("<IsTruncated>true</IsTruncated>"),  # no token to go on with
        _page("<IsTruncated>false</IsTruncated>").replace(b"false", b"f\xffalse"),  # not UTF-8
        b"<Wrapper>" + _page("<IsTruncated>false</IsTruncated>")[38:] + b"</Wrapper>",
    ],
)
def test_a_page_that_is_not_a_listing_is_a_malformed_response_naming_the_prefix(
    body: bytes,
) -> None:
    with pytest.raises(ConnectionFailed) as info:
        parse_page(body, "root/", URL)
    assert (info.value.cause, info.value.url, info.value.stage) == (
        Reason.MALFORMED_RESPONSE,
        URL,
        "list",
    )
    assert info.value.retryable


PLAIN_PAGES = {
    "url-encoded, S3's element order": _page(
        "<Name>b</Name><Prefix>root/</Prefix><KeyCount>2</KeyCount><EncodingType>url"
        "</EncodingType><IsTruncated>true</IsTruncated><NextContinuationToken>t%2B1/="
        "</NextContinuationToken><Contents><Key>root/a+b%2Bc.bin</Key><LastModified>"
        "2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;e&quot;</ETag><Size>12</Size>"
        "<Owner><ID>o</ID><DisplayName>o</DisplayName></Owner><StorageClass>STANDARD"
        "</StorageClass></Contents><Contents><Key>root/%C3%BC%25.bin</Key><Size>0</Size>"
        "</Contents><CommonPrefixes><Prefix>root/sub+dir/</Prefix></CommonPrefixes>"
    ),
    "not encoded": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>root/a+b%41 \u00e9</Key><Size>3</Size>"
        "</Contents><CommonPrefixes><Prefix>root/q'/</Prefix></CommonPrefixes>"
    ),
    "a token on a page that is not truncated": _page(
        "<IsTruncated>false</IsTruncated><NextContinuationToken>t</NextContinuationToken>"
    ),
    "size before key, pretty-printed": _page(
        "\n  <IsTruncated>false</IsTruncated>\n  <Contents>\n    <Size>7</Size>\n"
        "    <Key>root/x.bin</Key>\n  </Contents>\n  <CommonPrefixes>\n    <Prefix>root/d/"
        "</Prefix>\n  </CommonPrefixes>\n"
    ),
    "no namespace, no objects": _page("<IsTruncated>false</IsTruncated>", ns=""),
}

UNUSUAL_PAGES = {
    "entities and character references": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>root/a&amp;b&lt;&#233;&#x41;+%41"
        "</Key><Size>3</Size></Contents><CommonPrefixes><Prefix>root/&quot;q&apos;/</Prefix>"
        "</CommonPrefixes>"
    ),
    "a character reference in the token": _page(
        "<IsTruncated>true</IsTruncated><NextContinuationToken>a&amp;b&#x80;"
        "</NextContinuationToken>"
    ),
    "whitespace in a tag": _page(
        "<IsTruncated >true</IsTruncated><NextContinuationToken>t</NextContinuationToken>"
        "<Contents ><Key>root/a</Key><Size>1</Size></Contents >"
    ),
    "an attribute": _page(
        '<IsTruncated>false</IsTruncated><Contents xmlns="x"><Key>root/a</Key><Size>1</Size>'
        "</Contents>"
    ),
    "a self-closing element": _page("<IsTruncated>false</IsTruncated><Contents/>"),
    "a carriage return in a key": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>root/a\r\nb</Key><Size>1</Size></Contents>"
    ),
    "an empty size": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>root/a</Key><Size></Size></Contents>"
    ),
    "an element twice": _page("<IsTruncated>false</IsTruncated><IsTruncated>true</IsTruncated>"),
    "a flag with spaces": _page("<IsTruncated>false </IsTruncated>"),
    "a processing instruction": _page(
        "<IsTruncated>false</IsTruncated><?pi <Contents><Key>root/x</Key><Size>1</Size>"
        "</Contents>?>"
    ),
    "another encoding": (
        b'<?xml version="1.0" encoding="ISO-8859-1"?><ListBucketResult>'
        b"<IsTruncated>false</IsTruncated><Contents><Key>root/\xc3\xa9</Key><Size>1</Size>"
        b"</Contents></ListBucketResult>"
    ),
    "CDATA": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key><![CDATA[root/a<b]]></Key>"
        "<Size>1</Size></Contents>"
    ),
    "a comment": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>root/a<!-- x --></Key>"
        "<Size>1</Size></Contents>"
    ),
    "prefixed names": (
        b'<?xml version="1.0"?><ListBucketResult xmlns:s3="http://s3.amazonaws.com/doc/'
        b'2006-03-01/"><s3:IsTruncated>false</s3:IsTruncated><s3:Contents><s3:Key>root/a'
        b"</s3:Key><s3:Size>1</s3:Size></s3:Contents></ListBucketResult>"
    ),
    "an object without a size": _page(
        "<IsTruncated>false</IsTruncated><Contents><Key>root/a</Key></Contents>"
    ),
}


@pytest.mark.parametrize("name", PLAIN_PAGES)
def test_a_plain_page_is_read_without_the_tree_as_the_tree_reads_it(name: str) -> None:
    body = PLAIN_PAGES[name]
    plain = _plain_page(body, "root/")
    assert plain is not None
    assert plain == _tree_page(body, "root/", URL)


@pytest.mark.parametrize("name", UNUSUAL_PAGES)
def test_a_page_not_plainly_written_is_left_to_the_tree(name: str) -> None:
    body = UNUSUAL_PAGES[name]
    assert _plain_page(body, "root/") is None
    assert parse_page(body, "root/", URL) == _tree_page(body, "root/", URL)
