"""ConcurrentDataLoader is a drop-in for torch.utils.data.DataLoader: each scenario runs
against a stock DataLoader and ours, built with the same arguments, and compares what a
user can observe: the values and their order over epochs, the attributes, ``len``, what
``get_worker_info()`` shows a ``worker_init_fn`` (dataset, seeds), the errors torch raises
for invalid arguments (type and message), and how iteration goes on after a batch fails.

The datasets are small and in memory; workers use fork except in one test per other start
method. Where torch defines a message only for its own error wrapping (an exception raised
in a worker), the type and the original message are compared.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
    get_worker_info,
)

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.testing.memory import MemoryConfig

Loader = Callable[..., DataLoader[Any]]
LOADERS: list[Loader] = [DataLoader, ConcurrentDataLoader]

# Python 3.12+ warns about forking a process that has threads (torch's own), harmless for
# DataLoader workers.
pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


# ---------------------------------------------------------------------------- datasets


class Squares(Dataset[dict[str, Any]]):
    """Sample ``i``: its index, its square as a tensor, and the dataset's ``tag``, which a
    ``worker_init_fn`` sets per worker. Indices in ``bad`` raise ValueError."""

    def __init__(self, n: int = 20, bad: tuple[int, ...] = ()) -> None:
        self.n = n
        self.bad = set(bad)
        self.tag = "main"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index in self.bad:
            raise ValueError(f"bad sample {index}")
        return {"index": index, "square": torch.tensor(index * index), "tag": self.tag}


class Keyed(Dataset[int]):
    """Indexed by string keys; a list of keys is a bulk read."""

    def __init__(self) -> None:
        self.values = {key: ord(key) for key in "abcdefg"}

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: str | list[str]) -> Any:
        if isinstance(key, list):
            return [self.values[k] for k in key]
        return self.values[key]


class Stream(IterableDataset[int]):
    """``n`` numbers, sharded over workers through ``get_worker_info()``."""

    def __init__(self, n: int = 11) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(worker, self.n, workers))


class SlowInWorkerZero(Dataset[tuple[int, int]]):
    """Sample ``i`` and the worker that produced it; worker 0 takes 0.2 s per sample."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[int, int]:
        info = get_worker_info()
        assert info is not None
        if info.id == 0:
            time.sleep(0.2)
        return index, info.id


def tag_worker(worker_id: int) -> None:
    """A worker_init_fn that configures the worker's dataset through get_worker_info()."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    dataset = info.dataset
    # ``__class__``: ``type()`` of ConcurrentDataLoader's dataset in a worker is the proxy
    # that forwards to the user's dataset.
    dataset.tag = (  # type: ignore[attr-defined]
        f"worker {info.id}/{info.num_workers} {dataset.__class__.__name__} "
        f"{isinstance(dataset, Squares)} len={len(dataset)} "  # type: ignore[arg-type]
        f"seed={info.seed} initial_seed={torch.initial_seed()}"
    )


# ---------------------------------------------------------------------------- helpers


def plain(value: Any) -> Any:
    """``value`` with tensors as (dtype, list), for comparison."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


def outcomes(loader: DataLoader[Any], limit: int = 200) -> list[Any]:
    """One epoch: each batch, or ``("raised", type, message)`` for a failed ``next()``,
    going on after it as a training loop that catches errors would."""
    got: list[Any] = []
    iterator = iter(loader)
    for _ in range(limit):
        try:
            batch = next(iterator)
        except StopIteration:
            return got
        except Exception as exc:
            bad = [i for i in range(100) if f"bad sample {i}" in str(exc)]
            got.append(("raised", type(exc).__name__, bad))
        else:
            got.append(plain(batch))
    raise AssertionError("the epoch did not end")


def epochs(loader: DataLoader[Any], count: int = 2) -> list[list[Any]]:
    return [outcomes(loader) for _ in range(count)]


def both(build: Callable[[Loader], DataLoader[Any]], count: int = 2) -> list[list[list[Any]]]:
    """The epochs of a stock loader and of ours, each built by ``build(cls)``; asserted equal."""
    results = []
    for cls in LOADERS:
        torch.manual_seed(0)  # without a generator, the seeds come from the global RNG
        loader = build(cls)
        assert isinstance(loader, DataLoader)
        results.append(epochs(loader, count))
    stock, ours = results
    assert ours == stock
    return results


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------- values and order

CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {
    "sequential": lambda: {"batch_size": 4},
    "shuffle": lambda: {"batch_size": 4, "shuffle": True, "generator": seeded(1)},
    "drop_last": lambda: {
        "batch_size": 3,
        "shuffle": True,
        "drop_last": True,
        "generator": seeded(2),
    },
    "unbatched": lambda: {"batch_size": None, "shuffle": True, "generator": seeded(3)},
    "batch_sampler": lambda: {"batch_sampler": [[3, 1], [0], [5, 4, 2], [19]]},
    "sampler": lambda: {"batch_size": 3, "sampler": RandomSampler(range(20), generator=seeded(4))},
    "collate_fn": lambda: {"batch_size": 5, "collate_fn": list},
}
WORKERS = {
    "main": {"num_workers": 0},
    "workers": {"num_workers": 2, "worker_init_fn": tag_worker},
    "persistent": {"num_workers": 2, "worker_init_fn": tag_worker, "persistent_workers": True},
}


@pytest.mark.parametrize("workers", list(WORKERS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_values_and_order_over_epochs(config, workers):
    """Also what worker_init_fn sees through get_worker_info(): the user's dataset (its type,
    ``isinstance``, ``len``, an attribute set on it reaching the samples) and torch's seeds,
    derived from the same seeded generator."""
    stock, _ = both(lambda cls: cls(Squares(), **CONFIGS[config](), **WORKERS[workers]))
    assert sum(1 for epoch in stock for batch in epoch if batch) > 0
    if workers != "main" and config != "collate_fn":
        first = stock[0][0]
        tag = first[0]["tag"] if isinstance(first, list) else first["tag"]
        assert "Squares True len=20" in str(tag)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_global_rng_without_a_generator(num_workers):
    def build(cls: Loader) -> DataLoader[Any]:
        torch.manual_seed(123)
        return cls(Squares(), batch_size=4, shuffle=True, num_workers=num_workers)

    both(build, count=3)


def test_a_distributed_sampler_of_the_users_with_set_epoch():
    def run(cls: Loader) -> list[list[Any]]:
        dataset = Squares()
        sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=2, rank=1, shuffle=True, seed=4
        )
        loader = cls(dataset, batch_size=3, sampler=sampler, collate_fn=list)
        got = []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
            got.append(outcomes(loader))
        return got

    stock = run(DataLoader)
    assert run(ConcurrentDataLoader) == stock
    assert stock[0] != stock[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_samplers_of_keys_and_of_lists(num_workers):
    # Keys batched by the loader; then lists of keys, each a bulk __getitem__ (batch_size=None).
    both(lambda cls: cls(Keyed(), batch_size=2, sampler=list("gcaeb"), num_workers=num_workers))
    both(
        lambda cls: cls(
            Keyed(),
            batch_size=None,
            sampler=[["a", "b"], ["g"], ["c", "d", "e"]],
            num_workers=num_workers,
        )
    )


def test_our_datasets_give_what_a_stock_loader_gives():
    objects = {f"{i:03d}": bytes([i]) * (i + 1) for i in range(12)}
    datasets: list[ObjectDataset] = []

    def build(cls: Loader) -> DataLoader[Any]:
        datasets.append(ObjectDataset(MemoryConfig(objects), keys=sorted(objects), decode=len))
        return cls(datasets[-1], batch_size=5, shuffle=True, generator=seeded(8))

    both(build)
    for dataset in datasets:
        # The stock loader's ``ds[i]`` calls leased this process's event loop: give it back
        # now, not at garbage collection, so no thread of it is running at a later fork.
        dataset.close()


# ---------------------------------------------------------------------------- attributes


ATTRIBUTES = [
    "batch_size",
    "drop_last",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "pin_memory_device",
    "timeout",
    "worker_init_fn",
    "generator",
    "persistent_workers",
    "in_order",
    "multiprocessing_context",
    "collate_fn",
]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"batch_size": 2, "shuffle": True, "generator": torch.Generator()},
        {"batch_size": 3, "drop_last": True, "num_workers": 2, "prefetch_factor": 3},
        {"batch_size": None, "collate_fn": default_convert},
        {"batch_sampler": BatchSampler(SequentialSampler(range(10)), 4, False)},
        {"sampler": RandomSampler(range(10)), "batch_size": 4, "collate_fn": list},
        {
            "num_workers": 1,
            "persistent_workers": True,
            "multiprocessing_context": "spawn",
            "worker_init_fn": tag_worker,
            "timeout": 5.0,
            "in_order": False,
        },
    ],
    ids=["defaults", "shuffle", "workers", "unbatched", "batch_sampler", "sampler", "options"],
)
def test_attributes_are_the_users(kwargs):
    dataset = Squares(10)
    stock = DataLoader(dataset, **kwargs)
    ours = ConcurrentDataLoader(dataset, **kwargs)
    assert ours.dataset is dataset
    for name in ATTRIBUTES:
        assert getattr(ours, name) == getattr(stock, name), name
    for name in ("sampler", "batch_sampler"):
        assert type(getattr(ours, name)) is type(getattr(stock, name)), name
    for name in ("sampler", "batch_sampler"):
        if kwargs.get(name) is not None:
            assert getattr(ours, name) is kwargs[name]
    if kwargs.get("shuffle"):
        assert ours.sampler.generator is kwargs["generator"]  # type: ignore[union-attr]
    assert ours.collate_fn is stock.collate_fn  # default_collate / default_convert / the user's
    assert len(ours) == len(stock)
    assert len(iter(ours)) == len(iter(stock)) if not kwargs.get("num_workers") else True


def test_default_collate_is_torchs():
    assert ConcurrentDataLoader(Squares()).collate_fn is default_collate


def test_frozen_attributes_refuse_to_be_set_as_torchs():
    for cls in LOADERS:
        loader = cls(Squares(), batch_size=2)
        for name in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
            with pytest.raises(ValueError, match=f"{name} attribute should not be set after"):
                setattr(loader, name, None)
        loader.num_workers = 0  # the others may change, as in torch


def test_the_class_is_generic():
    alias = ConcurrentDataLoader[int]
    assert alias.__origin__ is ConcurrentDataLoader  # type: ignore[attr-defined]
    assert issubclass(ConcurrentDataLoader, DataLoader)


# ---------------------------------------------------------------------------- invalid arguments


def _stream() -> Stream:
    return Stream()


INVALID: list[tuple[Callable[[], Dataset[Any]], dict[str, Any]]] = [
    (Squares, {"batch_sampler": [[0]], "batch_size": 2}),
    (Squares, {"batch_sampler": [[0]], "drop_last": True}),
    (Squares, {"batch_sampler": [[0]], "shuffle": True}),
    (Squares, {"sampler": [0, 1], "shuffle": True}),
    (Squares, {"batch_size": None, "drop_last": True}),
    (Squares, {"num_workers": -1}),
    (Squares, {"timeout": -1}),
    (Squares, {"prefetch_factor": 2}),
    (Squares, {"num_workers": 1, "prefetch_factor": -1}),
    (Squares, {"persistent_workers": True}),
    (Squares, {"multiprocessing_context": "fork"}),
    (Squares, {"num_workers": 1, "multiprocessing_context": "no-such-method"}),
    (Squares, {"num_workers": 1, "multiprocessing_context": 3}),
    (_stream, {"shuffle": True}),
    (_stream, {"sampler": [0, 1]}),
    (_stream, {"batch_sampler": [[0]]}),
]


@pytest.mark.parametrize(("make", "kwargs"), INVALID, ids=[str(k) for _, k in INVALID])
def test_invalid_arguments_raise_torchs_errors(make, kwargs):
    errors = []
    for cls in LOADERS:
        with pytest.raises((ValueError, TypeError)) as caught:
            cls(make(), **kwargs)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[1] == errors[0]


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}],
    ids=["main", "workers", "persistent"],
)
def test_next_goes_on_after_a_failed_batch(kwargs):
    stock, _ = both(lambda cls: cls(Squares(bad=(5, 10, 11)), batch_size=4, **kwargs))
    assert [type(b) for b in stock[0]] == [dict, tuple, tuple, dict, dict]
    assert stock[0][1] == ("raised", "ValueError", [5])


def test_an_error_in_the_main_process_is_the_datasets_own():
    for cls in LOADERS:
        with pytest.raises(ValueError) as caught:
            next(iter(cls(Squares(bad=(2,)), batch_size=None, sampler=[2])))
        # Ours also notes which item it was loading (``__notes__``).
        assert caught.value.args == ("bad sample 2",)


# ---------------------------------------------------------------------------- IterableDataset


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [3, None])
def test_iterable_datasets_as_torch(num_workers, batch_size):
    stock, _ = both(
        lambda cls: cls(Stream(), batch_size=batch_size, num_workers=num_workers), count=1
    )
    for cls in LOADERS:
        assert len(cls(Stream(), batch_size=batch_size)) == len(
            DataLoader(Stream(), batch_size=batch_size)
        )
    values = [v for b in stock[0] for v in (b[1] if batch_size else [b])]
    assert sorted(values) == list(range(11))


# ---------------------------------------------------------------------------- out of order


def test_out_of_order_an_idle_worker_takes_over():
    """With ``in_order=False`` a slow worker does not hold a fixed share: the other worker
    produces most batches, and every sample still arrives exactly once."""
    for cls, extra in ((DataLoader, {}), (ConcurrentDataLoader, {"prefetch_batches": 1})):
        loader = cls(SlowInWorkerZero(), batch_size=2, num_workers=2, in_order=False, **extra)
        batches = [[(int(i), int(w)) for i, w in zip(*batch, strict=True)] for batch in loader]
        samples = sorted(i for batch in batches for i, _ in batch)
        assert samples == list(range(24)), cls
        by_fast_worker = sum(1 for batch in batches if batch[0][1] == 1)
        assert by_fast_worker >= 8, (cls, batches)


# ---------------------------------------------------------------------------- start methods


def compare_start_method(context: str) -> None:
    both(
        lambda cls: cls(
            Squares(bad=(7,)),
            batch_size=3,
            shuffle=True,
            generator=seeded(9),
            num_workers=2,
            persistent_workers=True,
            worker_init_fn=tag_worker,
            multiprocessing_context=context,
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_other_start_methods(context):
    if context == "spawn":
        compare_start_method(context)
        return
    # The forkserver is one per process, and its children get the environment it started
    # with: run in a child process, so that this test's forkserver is not the one a later
    # test (say, with S3 credentials in its environment) gets.
    child = multiprocessing.get_context("spawn").Process(
        target=compare_start_method, args=(context,)
    )
    child.start()
    child.join(timeout=100)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0
