"""What ``concurrent-loader pack`` writes: the samples of a source, checked against the rules
that make both readers (:class:`~concurrent_loader.ShardDataset` and ``webdataset``) read
them as the packer promises.

A member name splits into sample key and extension as both readers split it
(:func:`~concurrent_loader.shards.tar.split_name`, ``webdataset.base_plus_ext``): at the
first dot of its last path component, the extension lower-cased. A :class:`PackPlan`
guarantees:

- every member is a sample member for both readers and splits into exactly the sample key
  and extension the plan gives it;
- no sample has two members with one extension (``a.JPG`` and ``a.jpg``; in an image
  folder ``x.jpg`` and ``x.png``, or ``a.b.jpg`` and ``a_b.jpg``), which both readers
  refuse, and no member's extension is a field of webdataset's sample (``__key__``...);
- samples are in key order with their members adjacent, so each key is one sample;
- objects that no reader makes part of a sample (a dotfile, a name without an extension,
  a webdataset metadata name such as ``__meta__/x.json``) are left out, listed in
  :attr:`PackPlan.skipped` and not counted.

A source that breaks a rule is refused with a :class:`~concurrent_loader.ConfigError`
naming its objects, before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..dataset import ImageFolder
from ..errors import ConfigError, Reason
from ..stores import ObjectInfo, StoreConfig
from .tar import BLOCK, is_sample_member, padded, split_name

__all__ = [
    "PackEntry",
    "PackPlan",
    "Sample",
    "first_few",
    "plan_image_folder",
    "plan_objects",
    "split_shards",
]

_SAMPLE_FIELDS = ("__key__", "__url__", "__local_path__")  # what webdataset adds to a sample
_LISTED = 10  # colliding groups or skipped objects named in a message


@dataclass(frozen=True)
class PackEntry:
    """One member to write: its name in the tar, the source object it comes from, its size,
    and its bytes when they are not the source's (an image's ``.cls`` label)."""

    name: str
    source: str
    size: int
    data: bytes | None = None


Sample = list[PackEntry]


@dataclass(frozen=True)
class PackPlan:
    """The samples to write, in order, and the source keys left out (see the module)."""

    samples: list[Sample]
    skipped: list[str]


def plan_objects(store: StoreConfig, listed: Sequence[ObjectInfo]) -> PackPlan:
    """Each object a member named by its key; the objects with one sample key, one sample."""
    by_key: dict[str, Sample] = {}
    skipped: list[str] = []
    for info in sorted(listed, key=lambda info: info.key):
        split = split_name(info.key)
        if split is None or not is_sample_member(info.key) or _is_dotfile(info.key):
            skipped.append(info.key)
        else:
            by_key.setdefault(split[0], []).append(PackEntry(info.key, info.key, info.size))
    return _checked(store, by_key, skipped)


def plan_image_folder(store: StoreConfig, listed: Sequence[ObjectInfo]) -> PackPlan:
    """Each image ``c/x.jpg`` (chosen as :class:`~concurrent_loader.ImageFolder` chooses)
    sample ``c/x`` with members ``c/x.jpg`` and ``c/x.cls`` (the class index as decimal
    text); dots before the image's extension become ``_`` (``c/a.b.jpg`` is sample ``c/a_b``),
    since both readers split at the first dot."""
    size_of = {info.key: info.size for info in listed}
    folder = ImageFolder(store, keys=list(size_of))
    by_key: dict[str, Sample] = {}
    for image, target in zip(folder.keys, folder.targets.tolist(), strict=True):
        directory, _, filename = image.rpartition("/")
        stem, _, extension = filename.rpartition(".")
        key = f"{directory}/{stem.replace('.', '_')}"
        label = str(target).encode("ascii")
        by_key.setdefault(key, []).extend(
            [
                PackEntry(f"{key}.{extension}", image, size_of[image]),
                PackEntry(f"{key}.cls", image, len(label), label),
            ]
        )
    return _checked(store, by_key, [])


def split_shards(samples: list[Sample], shard_size: int) -> Iterator[list[Sample]]:
    """Samples in shards: a shard closes before a sample that would take it past
    ``shard_size`` bytes of tar (a single larger sample gets a shard of its own)."""
    shard: list[Sample] = []
    used = 0
    for sample in samples:
        size = sum(BLOCK + padded(entry.size) for entry in sample)
        if shard and used + size > shard_size:
            yield shard
            shard, used = [], 0
        shard.append(sample)
        used += size
    if shard:
        yield shard


def _checked(store: StoreConfig, by_key: dict[str, Sample], skipped: list[str]) -> PackPlan:
    misread: list[str] = []
    collisions: dict[tuple[str, ...], tuple[str, str]] = {}
    for key, sample in by_key.items():
        sources_of: dict[str, list[str]] = {}
        for entry in sample:
            split = split_name(entry.name)
            if not is_sample_member(entry.name) or split is None or split[0] != key:
                misread.append(f"{store.url_for(entry.source)} (as member {entry.name!r})")
                continue
            sources_of.setdefault(split[1], []).append(entry.source)
        for extension, sources in sources_of.items():
            if len(sources) > 1 or extension in _SAMPLE_FIELDS:
                collisions.setdefault(tuple(dict.fromkeys(sources)), (key, extension))
    if misread:
        raise ConfigError(
            "objects that the readers would not read back as the sample the packer makes of "
            f"them: {first_few(misread)}; rename them",
            url=store.url_for(""),
            cause=Reason.INVALID_ARGUMENT,
        )
    if collisions:
        groups = [
            f"{' and '.join(store.url_for(s) for s in sources)} -> sample {key!r}, "
            f"extension {extension!r}"
            for sources, (key, extension) in collisions.items()
        ]
        raise ConfigError(
            "objects that map to one member of one sample, which neither ShardDataset nor "
            "webdataset can read (extensions compare lower-cased; '__key__', '__url__' and "
            "'__local_path__' are fields of the sample; in an image folder each image is a "
            f"sample with a 'cls' member): {first_few(groups)}; rename or remove them",
            url=store.url_for(""),
            cause=Reason.INVALID_ARGUMENT,
        )
    samples = [by_key[key] for key in sorted(by_key)]
    if not samples:
        raise ConfigError(
            f"nothing to pack under {store}: none of its {len(skipped)} objects is part of a "
            f"sample (skipped: {first_few(skipped)})",
            url=store.url_for(""),
            cause=Reason.EMPTY_PREFIX,
        )
    return PackPlan(samples, skipped)


def _is_dotfile(key: str) -> bool:
    # webdataset reads "c/.hidden" as sample "c/" (the split backs up into the folder name)
    return key.rpartition("/")[2].startswith(".")


def first_few(items: Sequence[str]) -> str:
    """The first few of ``items``, and how many more there are."""
    shown = "; ".join(items[:_LISTED])
    return shown if len(items) <= _LISTED else f"{shown}; and {len(items) - _LISTED} more"
