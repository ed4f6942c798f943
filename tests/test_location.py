import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.location import parse_location


def test_s3():
    loc = parse_location("s3://bucket/a/b")
    assert (loc.scheme, loc.bucket, loc.prefix) == ("s3", "bucket", "a/b/")
    assert loc.url_for("c.jpg") == "s3://bucket/a/b/c.jpg"
    assert parse_location("s3://bucket").prefix == ""


def test_http():
    loc = parse_location("https://host:8443/data")
    assert (loc.netloc, loc.prefix) == ("host:8443", "/data/")
    assert loc.url_for("x") == "https://host:8443/data/x"


def test_local(tmp_path):
    loc = parse_location(tmp_path)
    assert loc.is_local and loc.url_for("a") == str(tmp_path / "a")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "gs://bucket/x",
        "s3:///nobucket",
        "s3://user:pw@bucket/x",
        "http:///nohost",
        "https://user:secret@host/x",
    ],
)
def test_malformed_roots_are_refused_with_the_input_named(bad):
    with pytest.raises(ConfigError) as info:
        parse_location(bad)
    if bad and "secret" not in bad:
        assert bad.split("://")[0] in str(info.value)
    assert "secret" not in str(info.value)
