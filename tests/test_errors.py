import pickle

import pytest

from concurrent_loader import errors


def _all_error_classes():
    return [getattr(errors, name) for name in errors.__all__ if name != "Reason"]


@pytest.mark.parametrize("cls", _all_error_classes())
def test_every_error_pickles_with_its_attributes(cls):
    exc = cls(
        "HTTP 404",
        url="s3://b/k.jpg",
        stage="fetch",
        cause="NotFound",
        status=404,
        code="NoSuchKey",
    )
    exc.add_note("gave up after 3 attempts")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc)
    assert (back.url, back.stage, back.cause, back.status, back.code) == (
        "s3://b/k.jpg",
        "fetch",
        errors.Reason.NOT_FOUND,
        404,
        "NoSuchKey",
    )
    assert back.__notes__ == ["gave up after 3 attempts"]


@pytest.mark.parametrize("cls", _all_error_classes())
def test_every_error_builds_from_one_message(cls):
    # torch's DataLoader re-creates worker exceptions as exc_type(message).
    assert str(cls("some message")) == "some message"


def test_message_names_object_cause_and_stage():
    exc = errors.AccessDenied("HTTP 403", url="s3://b/k", stage="fetch", cause="AccessDenied")
    assert str(exc) == "AccessDenied: s3://b/k - HTTP 403 (stage: fetch)"


def test_causes_have_one_spelling():
    assert errors.LoaderError("x", cause="NotFound").cause is errors.Reason.NOT_FOUND
    with pytest.raises(ValueError):
        errors.LoaderError("x", cause="object not found")


def test_tree():
    assert issubclass(errors.FetchTimeout, TimeoutError)
    assert issubclass(errors.ConfigError, ValueError)
    for cls in (
        errors.ObjectNotFound,
        errors.AccessDenied,
        errors.Throttled,
        errors.IncompleteBody,
        errors.IntegrityError,
    ):
        assert issubclass(cls, errors.FetchError) and issubclass(cls, errors.LoaderError)
    retryable = {c for c in _all_error_classes() if c.retryable}
    assert retryable == {
        errors.Throttled,
        errors.ServerError,
        errors.ConnectionFailed,
        errors.IncompleteBody,
        errors.IntegrityError,
        errors.FetchTimeout,
    }


def test_naming_an_object_keeps_notes_apart_and_adds_none():
    plain = errors.ConfigError("bad").for_object("s3://bucket/key")
    assert not hasattr(plain, "__notes__")
    noted = errors.ConfigError("bad")
    noted.add_note("first")
    named = noted.for_object("s3://bucket/key")
    named.add_note("second")
    assert noted.__notes__ == ["first"] and named.__notes__ == ["first", "second"]


def test_for_object_can_name_the_part_of_the_object_first_in_its_message():
    named = errors.ShardError("bad header", stage="decode").for_object("s3://b/a.tar", "sample 'x'")
    assert named.url == "s3://b/a.tar" and named.message == "sample 'x': bad header"
    assert named.stage == "decode" and type(named) is errors.ShardError
    bare = errors.ShardError().for_object("s3://b/a.tar", "sample 'x'")
    assert bare.message == "sample 'x'"
