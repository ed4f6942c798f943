"""A failing sample under each policy: ``on_error="raise"`` fails its batch, raised when the
consumer reaches it; ``on_error="skip"`` leaves our errors out as :class:`Partial` batches;
whatever a ``decode`` callable raises is a :class:`DecodeError` naming the object; errors
from a user's own ``__getitem__`` keep their type, as with torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from concurrent_loader import FetchConfig, ObjectDataset
from concurrent_loader.errors import (
    AccessDenied,
    DecodeError,
    LoaderError,
    ObjectNotFound,
    Reason,
    ServerError,
)
from concurrent_loader.metrics.stats import COUNTERS
from concurrent_loader.pipeline import BatchPipeline, Partial, PipelineOptions, SkippedSample
from concurrent_loader.testing.memory import MemoryConfig

COUNT = 30
BATCHES = [list(range(i, i + 5)) for i in range(0, COUNT, 5)]


def denying(bad: set[str]) -> Callable[[str, int], object]:
    def script(key: str, attempt: int) -> object:
        if key in bad:
            return AccessDenied("no", url=f"memory://test/{key}", cause=Reason.ACCESS_DENIED)
        return 0.001

    return script


def counter(pipeline: BatchPipeline, name: str) -> float:
    return pipeline.stats.vector()[COUNTERS.index(name)]


def pipeline_of(dataset: ObjectDataset, **options: Any) -> BatchPipeline:
    options.setdefault("prefetch_batches", 3)
    return BatchPipeline(dataset, BATCHES, collate_fn=list, options=PipelineOptions(**options))


def test_failing_batch_raises_when_reached_after_every_earlier_batch(helpers):
    bad = helpers.key_for(17)  # batch 3
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying({bad}))
    got = []
    with pytest.raises(AccessDenied) as caught:
        for batch in pipeline_of(ObjectDataset(store, decode=helpers.index_of)):
            got.append(batch)
    assert got == BATCHES[:3]
    assert caught.value.url == f"memory://test/{bad}"
    assert caught.value.cause is Reason.ACCESS_DENIED
    assert store.stats.gets[bad] == 1  # not retried


def test_transient_failure_is_retried_inside_the_pipeline(helpers):
    flaky = helpers.key_for(4)

    def script(key: str, attempt: int) -> object:
        if key == flaky and attempt < 2:
            return ServerError("boom", url=f"memory://test/{key}", cause=Reason.SERVER_ERROR)
        return None

    store = MemoryConfig(helpers.numbered_objects(COUNT), script=script)
    dataset = ObjectDataset(store, decode=helpers.index_of, fetch_config=helpers.no_backoff())
    pipeline = pipeline_of(dataset)
    assert list(pipeline) == BATCHES
    assert store.stats.gets[flaky] == 3
    assert counter(pipeline, "retries") == 2


def test_skip_yields_partial_batches_naming_what_was_left_out(helpers):
    bad = {helpers.key_for(i) for i in (6, 8, 20, 21, 22, 23, 24)}  # batch 1: two; 4: all
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying(bad))
    pipeline = pipeline_of(ObjectDataset(store, decode=helpers.index_of), on_error="skip")
    got = list(pipeline)
    assert got[0] == BATCHES[0] and got[2:4] == BATCHES[2:4] and got[5] == BATCHES[5]
    partial = got[1]
    assert isinstance(partial, Partial)
    assert partial.batch == [5, 7, 9]
    assert [(s.index, s.url) for s in partial.skipped] == [
        (6, f"memory://test/{helpers.key_for(6)}"),
        (8, f"memory://test/{helpers.key_for(8)}"),
    ]
    assert all(isinstance(s, SkippedSample) for s in partial.skipped)
    assert all(isinstance(s.error, AccessDenied) for s in partial.skipped)
    emptied = got[4]
    assert isinstance(emptied, Partial) and emptied.batch is None
    assert [s.index for s in emptied.skipped] == [20, 21, 22, 23, 24]
    assert counter(pipeline, "skipped") == 7


def test_skip_names_objects_missing_from_the_store(helpers):
    objects = helpers.numbered_objects(COUNT)
    keys = list(objects)
    del objects[helpers.key_for(12)]
    store = MemoryConfig(objects)
    pipeline = pipeline_of(ObjectDataset(store, keys, decode=helpers.index_of), on_error="skip")
    partial = list(pipeline)[2]
    assert isinstance(partial, Partial)
    (skipped,) = partial.skipped
    assert skipped.index == 12 and isinstance(skipped.error, ObjectNotFound)
    assert skipped.url == f"memory://test/{helpers.key_for(12)}"


def test_any_error_from_user_decode_is_a_decode_error_naming_the_object(helpers):
    def decode(data: bytes | bytearray) -> int:
        index = helpers.index_of(data)
        if index == 13:
            raise ValueError("not a sample")
        return index

    store = MemoryConfig(helpers.numbered_objects(COUNT))
    got = []
    with pytest.raises(DecodeError, match="ValueError: not a sample") as caught:
        for batch in pipeline_of(ObjectDataset(store, decode=decode)):
            got.append(batch)
    assert got == BATCHES[:2]
    error = caught.value
    assert error.url == f"memory://test/{helpers.key_for(13)}"
    assert (error.stage, error.cause) == ("decode", Reason.UNDECODABLE)
    assert isinstance(error.__cause__, ValueError)

    skipping = pipeline_of(ObjectDataset(store, decode=decode), on_error="skip")
    partial = list(skipping)[2]
    assert isinstance(partial, Partial) and partial.batch == [10, 11, 12, 14]
    assert [s.index for s in partial.skipped] == [13]


def test_errors_from_a_user_getitem_keep_their_type_with_the_index_noted(helpers):
    from torch.utils.data import Dataset

    class Items(Dataset[int]):
        def __len__(self) -> int:
            return COUNT

        def __getitem__(self, index: int) -> int:
            if index == 13:
                raise ValueError("not a sample")
            return index

    with pytest.raises(ValueError, match="not a sample"):
        list(BatchPipeline(Items(), BATCHES, collate_fn=list, options=PipelineOptions()))


def test_decode_error_without_a_url_gets_the_objects_and_is_skipped(helpers):
    def decode(data: bytes | bytearray) -> int:
        index = helpers.index_of(data)
        if index == 2:
            raise DecodeError("truncated", stage="decode", cause=Reason.UNDECODABLE)
        return index

    store = MemoryConfig(helpers.numbered_objects(COUNT))
    got = list(pipeline_of(ObjectDataset(store, decode=decode), on_error="skip"))
    partial = got[0]
    assert isinstance(partial, Partial) and partial.batch == [0, 1, 3, 4]
    (skipped,) = partial.skipped
    assert isinstance(skipped.error, DecodeError)
    assert skipped.error.url == skipped.url == f"memory://test/{helpers.key_for(2)}"
    assert skipped.error.cause is Reason.UNDECODABLE


def test_collate_errors_are_noted(helpers):
    def collate(items: list[int]) -> list[int]:
        raise TypeError("cannot stack")

    store = MemoryConfig(helpers.numbered_objects(5))
    pipeline = BatchPipeline(
        ObjectDataset(store, decode=helpers.index_of),
        [[0, 1]],
        collate_fn=collate,
        options=PipelineOptions(),
    )
    with pytest.raises(TypeError) as caught:
        list(pipeline)
    assert "while collating a batch" in caught.value.__notes__


def test_first_failure_fails_the_batch_at_once(helpers):
    """Later samples of a failed batch are not decoded (their GETs may be in flight)."""
    decoded: list[int] = []

    def decode(data: bytes | bytearray) -> int:
        decoded.append(helpers.index_of(data))
        return decoded[-1]

    def script(key: str, attempt: int) -> object:
        if key == helpers.key_for(0):
            return AccessDenied("no", url=f"memory://test/{key}", cause=Reason.ACCESS_DENIED)
        return 0.002

    store = MemoryConfig(helpers.numbered_objects(COUNT), script=script)
    pipeline = BatchPipeline(
        ObjectDataset(store, decode=decode, fetch_config=FetchConfig(max_inflight_requests=64)),
        [list(range(COUNT))],
        collate_fn=list,
        options=PipelineOptions(),
    )
    with pytest.raises(LoaderError):
        list(pipeline)
    assert decoded == []


def test_outcomes_go_on_after_a_failed_batch(helpers):
    bad = {helpers.key_for(7), helpers.key_for(21)}  # batches 1 and 4
    store = MemoryConfig(helpers.numbered_objects(COUNT), script=denying(bad))
    pipeline = pipeline_of(ObjectDataset(store, decode=helpers.index_of))
    got = list(pipeline.outcomes())
    assert [type(o).__name__ for o in got] == ["list", "Failure", "list", "list", "Failure", "list"]
    assert [o for o in got if isinstance(o, list)] == [BATCHES[i] for i in (0, 2, 3, 5)]
    assert got[1].exc.url == f"memory://test/{helpers.key_for(7)}"
    assert pipeline.broken is None
