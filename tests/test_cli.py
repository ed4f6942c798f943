"""The command line (``python -m concurrent_loader``), run in a subprocess against the local
S3 server (the table of error cases and the no-tqdm case call the same ``main()`` in-process,
to keep the suite fast): manifests read back by ``from_manifest``, ``inspect`` counts, and
one-line errors with a non-zero exit status."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from concurrent_loader import ImageFolder, ObjectDataset
from concurrent_loader.cli import main
from concurrent_loader.testing import LocalS3Server

REPO = Path(__file__).resolve().parents[1]
PROG = "concurrent-loader"
CLI_BUCKET = "cli-test"


def cli_env(server: LocalS3Server | None = None, **overrides: str) -> dict[str, str]:
    """This environment without the developer's AWS setup, plus ``server``'s variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = os.devnull
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if server is not None:
        env.update(server.env())
    env.update(overrides)
    return env


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "concurrent_loader", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_manifest_round_trips_through_from_manifest(image_dataset, s3_server, s3_env, tmp_path):
    manifest = tmp_path / "train.txt"
    # No trailing slash: the root is a prefix either way.
    root = image_dataset.s3_url.rstrip("/")
    result = run_cli(["manifest", root, "-o", str(manifest)], cli_env(s3_server))
    assert result.returncode == 0, result.stderr
    if importlib.util.find_spec("tqdm") is not None:  # a dev requirement
        assert "listing" in result.stderr  # the progress bar
    assert f"wrote {len(image_dataset.files)} keys" in result.stderr

    lines = manifest.read_text().splitlines()
    assert lines == sorted(key for key, _, _ in image_dataset.files)

    ds = ObjectDataset.from_manifest(manifest, root=image_dataset.s3_url, decode=sha256_hex)
    with ds:
        assert len(ds) == len(image_dataset.files)
        digests = ds.__getitems__(list(range(len(ds))))
    assert digests == [digest for _, _, digest in sorted(image_dataset.files)]


@pytest.fixture
def cli_bucket(s3_server: LocalS3Server) -> str:
    """A bucket of these tests' own (1100 keys in the shared one would push other tests'
    keys off the first page of an unpaginated listing)."""
    s3_server.create_bucket(CLI_BUCKET)
    return CLI_BUCKET


def test_manifest_follows_pagination(s3_server, cli_bucket, tmp_path):
    # list_objects_v2 returns at most 1000 keys a page: 1100 keys need a second page.
    source = tmp_path / "many"
    source.mkdir()
    names = [f"part-{i:05d}.bin" for i in range(1100)]
    for name in names:
        (source / name).write_bytes(b"x")
    s3_server.upload_dir(source, cli_bucket, prefix="many/")
    manifest = tmp_path / "many.txt"
    result = run_cli(
        ["manifest", f"s3://{cli_bucket}/many/", "-o", str(manifest), "--no-progress"],
        cli_env(s3_server),
    )
    assert result.returncode == 0, result.stderr
    assert manifest.read_text().splitlines() == names
    assert "listing" not in result.stderr


def test_manifest_of_a_local_directory_without_tqdm(image_dataset, tmp_path, monkeypatch, capsys):
    # In-process (main() is what both entry points call), with tqdm made unimportable:
    # the command still works, with no bar.
    monkeypatch.setitem(sys.modules, "tqdm", None)
    manifest = tmp_path / "local.txt"
    assert main(["manifest", str(image_dataset.local_root), "-o", str(manifest)]) == 0
    assert "listing" not in capsys.readouterr().err
    assert manifest.read_text().splitlines() == sorted(key for key, _, _ in image_dataset.files)
    ds = ObjectDataset.from_manifest(manifest, root=image_dataset.local_root, decode=sha256_hex)
    assert [ds[i] for i in range(len(ds))] == [d for _, _, d in sorted(image_dataset.files)]


def test_manifest_feeds_image_folder_from_manifest(image_dataset, tmp_path):
    manifest = tmp_path / "train.txt"
    assert main(["manifest", str(image_dataset.local_root), "-o", str(manifest)]) == 0
    ds = ImageFolder.from_manifest(manifest, root=image_dataset.local_root, image_size=16)
    assert ds.classes == image_dataset.classes
    assert list(ds.keys) == sorted(key for key, _, _ in image_dataset.files)
    image, label = ds[0]
    assert tuple(image.shape) == (3, 16, 16) and label == 0


def test_inspect_counts_objects_bytes_and_classes(image_dataset, s3_server, s3_env, capsys):
    files = image_dataset.files
    total = sum((image_dataset.local_root / key).stat().st_size for key, _, _ in files)
    per_class = {name: 0 for name in image_dataset.classes}
    for _, name, _ in files:
        per_class[name] += 1

    result = run_cli(
        ["inspect", image_dataset.s3_url, "--image-folder", "--json"], cli_env(s3_server)
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "root": image_dataset.s3_url,
        "objects": len(files),
        "bytes": total,
        "images": len(files),
        "classes": per_class,
    }

    # The human-readable form (in-process; s3_env points the AWS chain at the server).
    assert main(["inspect", image_dataset.s3_url, "--image-folder", "--no-progress"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["objects:", str(len(files))] in lines
    assert [line[:2] for line in lines if line[0] == "bytes:"] == [["bytes:", str(total)]]
    assert ["images:", str(len(files)), "in", "3", "classes"] in lines
    for name, count in per_class.items():
        assert [name, str(count)] in lines


def test_an_error_is_one_line_and_exits_non_zero(s3_server):
    result = run_cli(["inspect", "s3://no-such-bucket-cli/x/"], cli_env(s3_server))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if "listing" not in line]
    lines = [line.strip() for line in lines if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{PROG}: error: BucketNotFound: s3://no-such-bucket-cli/x/")
    assert "NoSuchBucket" in lines[0]  # the server's own code
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args,env_overrides,expected",
    [
        (["inspect", "s3://cli-test/nothing-here/"], {}, "no objects under"),
        (
            ["manifest", "s3://test-data/images/train/", "-o", "manifest.txt"],
            {"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
            "s3://test-data/images/train/ - HTTP 403",
        ),
        (["inspect", "ftp://host/data/"], {}, "unknown scheme 'ftp'"),
        (["inspect", "s3://cli-test/flat/", "--image-folder"], {}, "no images"),
        (["manifest", "s3://test-data/images/train/", "-o", "/no/such/dir/m.txt"], {}, "/no/such"),
    ],
    ids=["empty-prefix", "bad-secret", "bad-scheme", "no-class-folders", "unwritable-output"],
)
def test_errors_are_one_line_and_status_1(
    image_dataset,
    s3_server,
    cli_bucket,
    s3_env,
    tmp_path,
    monkeypatch,
    capsys,
    args,
    env_overrides,
    expected,
):
    for name, value in env_overrides.items():
        monkeypatch.setenv(name, value)
    # Objects, but none in <class>/ folders.
    s3_server.put_object(cli_bucket, "flat/readme.txt", b"not an image")
    args = [str(tmp_path / a) if a == "manifest.txt" else a for a in args]
    assert main([*args, "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{PROG}: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "manifest.txt").exists()


def test_entry_point_is_declared_and_help_lists_the_commands(capsys):
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[PROG] == "concurrent_loader.__main__:main"
    from concurrent_loader import __main__

    assert __main__.main is main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "manifest" in out and "inspect" in out
    # A usage error is argparse's: status 2, a message naming the missing option.
    with pytest.raises(SystemExit) as exit_info:
        main(["manifest", "s3://bucket/prefix/"])
    assert exit_info.value.code == 2
    assert "-o/--output" in capsys.readouterr().err
