import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.stores import HttpConfig, LocalConfig, S3Config, store_config_for
from concurrent_loader.testing.memory import MemoryConfig


def test_s3():
    store = store_config_for("s3://bucket/a/b")
    assert isinstance(store, S3Config)
    assert (store.bucket, store.prefix) == ("bucket", "a/b/")
    assert store.url_for("c.jpg") == "s3://bucket/a/b/c.jpg"
    assert store_config_for("s3://bucket").prefix == ""  # type: ignore[attr-defined]
    assert store.capabilities.remote and store.capabilities.listing


def test_http():
    store = store_config_for("https://host:8443/data")
    assert isinstance(store, HttpConfig)
    assert (store.netloc, store.base) == ("host:8443", "/data/")
    assert store.url_for("x") == "https://host:8443/data/x"
    assert not store.capabilities.listing


def test_local(tmp_path):
    store = store_config_for(tmp_path)
    assert isinstance(store, LocalConfig)
    assert not store.capabilities.remote and store.url_for("a") == str(tmp_path / "a")
    assert store_config_for(f"file://{tmp_path}") == store


def test_a_store_config_is_its_own_root():
    memory = MemoryConfig({"a": b"x"})
    assert store_config_for(memory) is memory


def test_a_backends_options_are_its_config_given_as_the_root(tmp_path):
    store = S3Config.from_url("s3://b/p", endpoint_url="http://127.0.0.1:9000", anonymous=True)
    assert store_config_for(store) is store
    assert store.endpoint_url == "http://127.0.0.1:9000"
    assert store.credentials.anonymous
    # S3 options for a local directory (or any root not on S3) are refused, clearly.
    for root in (str(tmp_path), f"file://{tmp_path}", "https://host/data/"):
        with pytest.raises(ConfigError, match="S3 options apply to an s3://") as info:
            S3Config.from_url(root, endpoint_url="http://127.0.0.1:9000")
        assert info.value.cause == "InvalidArgument" and root in str(info.value)
    # A URL alone gets its backend's defaults; no option goes through the registry.
    with pytest.raises(TypeError):
        store_config_for("s3://b/p", endpoint_url="http://127.0.0.1:9000")  # type: ignore[call-arg]


def test_with_root_keeps_the_options_for_another_prefix():
    store = S3Config.from_url("s3://b/p/", endpoint_url="http://127.0.0.1:9000", region="r")
    other = store.with_root("s3://c/q")
    assert (other.bucket, other.prefix, other.endpoint_url, other.region) == (
        "c",
        "q/",
        "http://127.0.0.1:9000",
        "r",
    )


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "gs:///nobucket",
        "s3:///nobucket",
        "s3://user:pw@bucket/x",
        "http:///nohost",
        "https://user:secret@host/x",
    ],
)
def test_malformed_roots_are_refused_with_the_input_named(bad):
    with pytest.raises(ConfigError) as info:
        store_config_for(bad)
    if bad and "secret" not in bad:
        assert bad.split("://")[0] in str(info.value)
    assert "secret" not in str(info.value)
