"""The benchmark dataset: generated ImageNet-like JPEGs, cached on local disk and in S3.

Real ImageNet cannot be downloaded here and its licence forbids redistribution, so the
harness synthesises images with the statistics that matter to a loader: about 110 KB per
object at quality 90 and about 500x375 pixels, with content (smooth colour fields, many
hard-edged shapes, fine grain) whose JPEG entropy, and so whose decode cost, is close to a
photograph's. Generation is deterministic in the spec, so a cache is valid exactly when its
spec matches.

Layout (the ImageNet train layout that ``ImageFolder`` readers expect)::

    <root>/<spec.name>/train/<class>/<class>_<index>.JPEG
    <root>/<spec.name>/MANIFEST.json     # written last: its presence means "complete"

The same tree is uploaded to one bucket per spec under ``train/``; a manifest object beside
it marks a finished upload, so later runs skip both steps after one listing that checks the
prefix still holds exactly the dataset.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

# Bump when the synthesis changes, so that caches made by an older generator are rebuilt.
GENERATOR_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
MANIFEST_KEY = "_bench/MANIFEST.json"
TRAIN_PREFIX = "train/"


@dataclass(frozen=True)
class DatasetSpec:
    """What to generate. Two runs with equal specs share one cache."""

    images: int
    classes: int = 10
    width: int = 500
    height: int = 375
    quality: int = 90
    seed: int = 0

    def __post_init__(self) -> None:
        if self.images < 1:
            raise ValueError(f"images must be >= 1, got {self.images}")
        if not 1 <= self.classes <= self.images:
            raise ValueError(f"classes must be in [1, images], got {self.classes}")
        if self.width < 16 or self.height < 16:
            raise ValueError(f"images must be at least 16x16, got {self.width}x{self.height}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in [1, 100], got {self.quality}")

    @property
    def name(self) -> str:
        return (
            f"n{self.images}-c{self.classes}-{self.width}x{self.height}"
            f"-q{self.quality}-s{self.seed}-v{GENERATOR_VERSION}"
        )

    @property
    def bucket(self) -> str:
        # Bucket names allow lower-case letters, digits and hyphens only.
        return f"bench-{self.name}".lower().replace("_", "-")

    def class_name(self, label: int) -> str:
        return f"n{label:08d}"

    def relative_path(self, index: int) -> str:
        """Path of image ``index`` below the dataset root, with ``/`` separators."""
        label = index % self.classes
        cls = self.class_name(label)
        return f"train/{cls}/{cls}_{index:07d}.JPEG"


@dataclass(frozen=True)
class LocalDataset:
    """A complete generated dataset on local disk."""

    spec: DatasetSpec
    root: Path
    files: int
    total_bytes: int

    @property
    def train_dir(self) -> Path:
        return self.root / "train"

    @property
    def mean_object_bytes(self) -> float:
        return self.total_bytes / self.files


def synthesize_jpeg(spec: DatasetSpec, index: int) -> bytes:
    """Return the JPEG bytes of image ``index``; the same arguments give the same bytes."""
    rng = np.random.default_rng([spec.seed, index])
    w, h = spec.width, spec.height

    def smooth_field(grid_w: int, grid_h: int, amplitude: float) -> np.ndarray:
        # Bicubic upsampling of a coarse random grid gives the soft gradients of sky,
        # walls and out-of-focus backgrounds.
        coarse = rng.normal(0.0, 1.0, (grid_h, grid_w, 3))
        lo, hi = coarse.min(), coarse.max()
        small = Image.fromarray(((coarse - lo) / (hi - lo + 1e-9) * 255).astype(np.uint8))
        up = np.asarray(small.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
        return (up - 128.0) * amplitude

    base = rng.uniform(60, 190, 3).astype(np.float32)
    field = base + smooth_field(4, 3, 0.9) + smooth_field(16, 12, 0.35)
    field += smooth_field(64, 48, 0.12)
    img = Image.fromarray(np.clip(field, 0, 255).astype(np.uint8))

    # Many hard-edged objects: edges are where a photograph's JPEG bits go.
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(40, 120))):
        x0, y0 = int(rng.integers(-50, w)), int(rng.integers(-50, h))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            x1, y1 = x0 + int(rng.integers(5, 120)), y0 + int(rng.integers(5, 100))
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            points = [
                (x0 + int(rng.integers(0, 100)), y0 + int(rng.integers(0, 100)))
                for _ in range(int(rng.integers(3, 7)))
            ]
            draw.polygon(points, fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(0.8))

    # Fine grain (sensor noise, foliage, fabric); its strength sets the file size, and the
    # spread makes object sizes vary the way a real dataset's do.
    sigma = float(rng.uniform(15.0, 29.0))
    pixels = np.asarray(img, dtype=np.float32)
    grain = rng.normal(0.0, sigma, (h, w, 1)) + rng.normal(0.0, sigma * 0.4, (h, w, 3))
    pixels = np.clip(pixels + grain, 0, 255).astype(np.uint8)

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=spec.quality)
    return buf.getvalue()


def _write_range(spec: DatasetSpec, root: str, indices: range) -> int:
    total = 0
    for index in indices:
        path = os.path.join(root, spec.relative_path(index))
        data = synthesize_jpeg(spec, index)
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)
    return total


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _manifest(spec: DatasetSpec, files: int, total_bytes: int) -> dict[str, Any]:
    return {
        "spec": asdict(spec),
        "generator_version": GENERATOR_VERSION,
        "files": files,
        "total_bytes": total_bytes,
    }


def ensure_local(
    spec: DatasetSpec,
    root: Path,
    processes: int | None = None,
    progress: Any = None,
) -> tuple[LocalDataset, bool]:
    """Generate ``spec`` under ``root`` unless a complete copy is there.

    Returns the dataset and whether it was generated now. ``progress`` is an optional
    ``tqdm``-like object whose ``update(n)`` is called as files are written.
    """
    dest = root / spec.name
    manifest = _read_manifest(dest / MANIFEST_NAME)
    if manifest is not None and manifest.get("spec") == asdict(spec):
        return LocalDataset(spec, dest, manifest["files"], manifest["total_bytes"]), False

    # An incomplete tree (interrupted run) is removed rather than trusted.
    if dest.exists():
        shutil.rmtree(dest)
    for label in range(spec.classes):
        (dest / "train" / spec.class_name(label)).mkdir(parents=True, exist_ok=True)

    workers = max(1, processes or os.cpu_count() or 1)
    chunk = 32
    chunks = [range(i, min(i + chunk, spec.images)) for i in range(0, spec.images, chunk)]
    total = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_write_range, spec, str(dest), r) for r in chunks]
        for future, r in zip(futures, chunks, strict=True):
            total += future.result()
            if progress is not None:
                progress.update(len(r))

    (dest / MANIFEST_NAME).write_text(json.dumps(_manifest(spec, spec.images, total), indent=1))
    return LocalDataset(spec, dest, spec.images, total), True


class _S3Server(Protocol):
    def client(self, **config: Any) -> Any: ...

    def create_bucket(self, bucket: str) -> None: ...

    def upload_dir(self, local_dir: Path, bucket: str, prefix: str = ...) -> int: ...


def ensure_uploaded(local: LocalDataset, server: _S3Server) -> tuple[str, bool]:
    """Make ``s3://<spec.bucket>/train/`` hold exactly the files of ``local``.

    Uploads what is missing and deletes what does not belong (a tool that wrote, say, an
    index file beside the images would otherwise add a sample to every listing). Returns
    the bucket name and whether anything was changed now.
    """
    bucket = local.spec.bucket
    expected_manifest = _manifest(local.spec, local.files, local.total_bytes)
    expected_keys = set(list_keys(local.spec))
    client = server.client()
    try:
        server.create_bucket(bucket)
        present = _list(client, bucket, TRAIN_PREFIX)
        try:
            body = client.get_object(Bucket=bucket, Key=MANIFEST_KEY)["Body"].read()
            manifest = json.loads(body)
        except client.exceptions.ClientError:
            manifest = None  # no manifest yet: the upload never finished
        if manifest == expected_manifest and present == expected_keys:
            return bucket, False

        uploaded = server.upload_dir(local.train_dir, bucket, prefix=TRAIN_PREFIX)
        stray = sorted(_list(client, bucket, TRAIN_PREFIX) - expected_keys)
        for start in range(0, len(stray), 1000):
            client.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in stray[start : start + 1000]]},
            )
        present = _list(client, bucket, TRAIN_PREFIX)
        if present != expected_keys:
            raise RuntimeError(
                f"s3://{bucket}/{TRAIN_PREFIX} holds {len(present)} objects after the upload, "
                f"expected the {len(expected_keys)} files of {local.train_dir}"
            )
        client.put_object(
            Bucket=bucket, Key=MANIFEST_KEY, Body=json.dumps(expected_manifest).encode()
        )
        return bucket, bool(uploaded or stray)
    finally:
        client.close()


def _list(client: Any, bucket: str, prefix: str) -> set[str]:
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update(item["Key"] for item in page.get("Contents", ()))
    return keys


def list_keys(spec: DatasetSpec) -> list[str]:
    """Every object key of ``spec``, in index order (no LIST request needed)."""
    return [spec.relative_path(i) for i in range(spec.images)]


def class_names(spec: DatasetSpec) -> list[str]:
    return [spec.class_name(label) for label in range(spec.classes)]


def label_of_key(key: str) -> str:
    """The class directory of ``.../<class>/<file>``."""
    return key.rsplit("/", 2)[-2]


def iter_local_files(train_dir: Path) -> Iterable[tuple[Path, str]]:
    """(path, class) for every file below ``train_dir``, in sorted order."""
    for cls_dir in sorted(p for p in train_dir.iterdir() if p.is_dir()):
        for path in sorted(cls_dir.iterdir()):
            yield path, cls_dir.name
