"""The key table: keys and columns in one segment every process maps, released when the last
dataset holding it closes, or when its table is collected, or by a later process once its
creator is dead; manifests parsed into it."""

from __future__ import annotations

import gc
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from concurrent_loader.keys import KeyTable, parse_manifest_text, refused_key
from concurrent_loader.keys.folders import image_folder
from concurrent_loader.keys.segment import MAGIC, _layout


def test_roundtrip_unicode_and_empty():
    keys = ["a/b.jpg", "ünïcødé/ß.png", "", "x" * 300, "bad-utf8-\udcff"]
    table = KeyTable(keys)
    assert list(table) == keys and len(table) == len(keys)
    assert table[-1] == keys[-1] and table[1:3] == keys[1:3]
    assert list(pickle.loads(pickle.dumps(table))) == keys
    with pytest.raises(IndexError, match=f"key index {len(keys)} out of range"):
        table[len(keys)]
    with pytest.raises(IndexError):
        table[-len(keys) - 1]


def test_the_header_never_overlaps_the_first_array():
    """Regression: the segment's JSON header, whose length depends on the offsets it names,
    grew past the first array when its digits crossed an alignment boundary, so its closing
    brace became key 0's start offset (1,000 keys of 9 bytes: key 0 read as "")."""
    keys = [f"{i:05d}.bin" for i in range(1000)]
    assert KeyTable(keys)[0] == keys[0] and list(KeyTable(keys)) == keys
    for count in range(1, 20_000, 7):
        for columns in ({}, {"sizes": (np.dtype(np.int32), count)}):
            arrays = {
                "offsets": (np.dtype(np.uint32), count + 1),
                "blob": (np.dtype(np.uint8), 9 * count),
            }
            header, offsets = _layout(arrays | columns, {"lines": False})
            assert min(offsets.values()) >= len(MAGIC) + 8 + len(header), count


def test_a_pickled_table_is_its_segments_name_not_its_keys():
    keys = [f"train/n01440764/n01440764_{i}.JPEG" for i in range(2000)]
    table = KeyTable(keys, {"sizes": np.arange(len(keys))})
    assert len(pickle.dumps(table)) < len(table.path) + 200
    copy = pickle.loads(pickle.dumps(table))
    assert copy[1234] == keys[1234] and copy.column("sizes")[1234] == 1234  # type: ignore[index]


def _random_key(rng: random.Random) -> str:
    """A key of any characters a manifest line can hold."""
    alphabet = [chr(c) for c in range(1, 0x300) if chr(c) not in "\r\n"]
    alphabet += ["\u2028", "\u2029", "\x85", "日", "本", "\U0001f600"]
    return "k" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 20)))


def test_any_key_a_manifest_allows_round_trips_through_both_forms(tmp_path):
    rng = random.Random(7)
    keys = [_random_key(rng) for _ in range(500)] + [" leading", "tab\t", "a#b", "x\x0b\x0cy"]
    assert all(refused_key(k) is None for k in keys)
    text = "".join(f"{k}\n" for k in keys).encode()
    parsed = parse_manifest_text(text)
    assert list(parsed) == keys
    parsed.save(tmp_path / "keys.bin")
    assert list(KeyTable.load(tmp_path / "keys.bin")) == keys


def test_text_lines_split_as_documented():
    data = b"a.bin\r\n# comment\n\n   \n\xc2\x85\n\xe2\x80\xa8\nb c.bin\r\n\xc3\xbc\nlast"
    assert list(parse_manifest_text(data)) == ["a.bin", "b c.bin", "ü", "last"]
    assert list(parse_manifest_text(b"")) == []
    with pytest.raises(UnicodeDecodeError):
        parse_manifest_text(b"ok\n\xff\n")


def test_a_damaged_binary_manifest_is_refused(tmp_path):
    good = tmp_path / "k.bin"
    KeyTable(["a", "b"]).save(good)
    with pytest.raises(ValueError, match="not a key table"):
        KeyTable.load(b"a\nb\n")
    with pytest.raises(ValueError, match="not a readable key table"):
        KeyTable.load(good.read_bytes()[:-70])


def test_subset_keeps_the_chosen_keys_and_their_columns():
    keys = ["a", "", "bb", "ccc", "d"]
    table = KeyTable(keys, {"sizes": [10, 11, 12, 13, 14]})
    picked = table.subset(np.array([1, 2, 4]), {"targets": np.array([0, 1, 1])})
    assert list(picked) == ["", "bb", "d"]
    assert picked.column("sizes").tolist() == [11, 12, 14]  # type: ignore[union-attr]
    assert picked.column("targets").tolist() == [0, 1, 1]  # type: ignore[union-attr]


def test_the_segment_is_gone_after_the_last_release_and_after_collection():
    table = KeyTable(["a", "b"]).acquire().acquire()
    path = table.path
    table.release()
    assert os.path.exists(path)
    table.release()
    assert not os.path.exists(path)
    assert table[1] == "b"  # this process keeps its mapping
    again = pickle.loads(pickle.dumps(table))  # published again under a new name
    assert again.path != path and os.path.exists(again.path) and again[0] == "a"
    republished = again.path
    del table, again
    gc.collect()
    assert not os.path.exists(republished)
    collected = KeyTable(["c"]).path
    gc.collect()
    assert not os.path.exists(collected)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from concurrent_loader.keys import KeyTable
    table = KeyTable(["held/a.jpg", "held/b.jpg"])
    print(table.path, flush=True)
    time.sleep(120)
    """
)


def _holder() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert process.stdout is not None
    with process.stdout:
        return process, process.stdout.readline().strip()


def test_a_killed_creators_segment_is_removed_by_the_next_one_a_live_ones_kept():
    dead, dead_path = _holder()
    live, live_path = _holder()
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert os.path.exists(dead_path)  # nothing ran in the killed process
        fresh = KeyTable(["x"])  # a new segment cleans up first
        assert not os.path.exists(dead_path)
        assert os.path.exists(live_path)
        assert list(pickle.loads(pickle.dumps(fresh))) == ["x"]
    finally:
        live.kill()
        live.wait()
    KeyTable(["y"])
    assert not os.path.exists(live_path)


def test_a_dead_creators_segment_that_cannot_be_removed_does_not_stop_a_new_table(monkeypatch):
    """Another user's leftover in a sticky ``/dev/shm`` cannot be unlinked (EPERM): it is left
    there, and tables are still made."""
    dead, dead_path = _holder()
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    unlink = os.unlink

    def refuse(path, *args, **kwargs):
        if os.fspath(path) == dead_path:
            raise PermissionError(1, "Operation not permitted", path)
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    try:
        assert list(pickle.loads(pickle.dumps(KeyTable(["x"])))) == ["x"]
        assert os.path.exists(dead_path)
    finally:
        monkeypatch.undo()
        os.unlink(dead_path)


def test_a_creator_that_cannot_read_its_start_time_is_never_judged_dead(monkeypatch):
    from concurrent_loader.keys import segment

    start_time = segment._start_time
    monkeypatch.setattr(
        segment, "_start_time", lambda pid: None if pid == os.getpid() else start_time(pid)
    )
    first = KeyTable(["a"])
    KeyTable(["b"])  # cleans up before it is made
    assert os.path.exists(first.path) and list(pickle.loads(pickle.dumps(first))) == ["a"]


def test_subset_refuses_picks_out_of_order():
    table = KeyTable(["a", "b", "c"], {"sizes": [1, 2, 3]})
    assert list(table.subset(np.array([0, 2]))) == ["a", "c"]
    for picks in ([2, 0], [1, 1]):
        with pytest.raises(ValueError, match="ascending"):
            table.subset(np.array(picks))


def test_a_forked_child_never_removes_its_parents_segment():
    table = KeyTable(["a"]).acquire()
    pid = os.fork()
    if pid == 0:  # the child releases, collects and exits: the parent's file stays
        table.release()
        del table
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.path.exists(table.path)
    table.release()
    assert not os.path.exists(table.path)


def _reference_image_folder(keys: list[str], extensions: tuple[str, ...]) -> tuple[Any, ...]:
    """torchvision's rules, one str at a time (what ImageFolder did before)."""
    chosen = sorted(
        (k, i) for i, k in enumerate(keys) if "/" in k and k.lower().endswith(extensions)
    )
    classes = sorted({k.split("/", 1)[0] for k, _ in chosen})
    targets = [classes.index(k.split("/", 1)[0]) for k, _ in chosen]
    return [i for _, i in chosen], targets, classes


@pytest.mark.parametrize("seed", range(6))
def test_image_folder_rules_on_the_tables_bytes_match_them_on_strs(seed):
    rng = random.Random(seed)
    folders = ["a", "a-b", "a b", "ab", "日本", "Z", "x" * 20, "b/c", ""]
    names = ["1.jpg", "2.JPEG", "3.Png", "notes.txt", "jpg", "x.jpgx", "long" * 9 + ".webp"]
    names += [".jpg", "g", "pg", "x.jp", "\u212a.jpg"]  # short keys after a key's bytes
    keys = sorted({f"{rng.choice(folders)}/{rng.choice(names)}" for _ in range(300)})
    keys += ["top.jpg", "t.jpg/"]
    keys.sort()
    extensions = (".jpg", ".jpeg", ".png", ".webp")
    picks, targets, classes = _reference_image_folder(keys, extensions)
    text = "".join(f"{k}\r\n" if i % 3 else f"{k}\n#skipped\n" for i, k in enumerate(keys))
    for table in (KeyTable(keys), parse_manifest_text(text.encode())):
        found = image_folder(table, extensions)
        assert found is not None
        assert found[0].tolist() == picks and found[1].tolist() == targets and found[2] == classes
    shuffled = keys[:]
    rng.shuffle(shuffled)
    assert image_folder(KeyTable(shuffled), extensions) is None  # unsorted: the slow path
    assert image_folder(KeyTable(["c/1.jpg", "x.txt", "b/1.jpg"]), extensions) is None
    assert image_folder(KeyTable(["a/1.jpg", "a\x00/1.jpg"]), extensions) is None
    for tiny in (["a/.png"], ["/.jpg"], ["a/.jp", "a/g"]):  # blobs of 4 to 8 bytes
        assert image_folder(KeyTable(tiny), extensions) is not None
        found, expected = (
            image_folder(KeyTable(tiny), extensions),
            _reference_image_folder(tiny, extensions),
        )
        assert (found[0].tolist(), found[1].tolist(), found[2]) == expected


def test_no_extensions_take_the_slow_path_which_finds_no_images():
    assert image_folder(KeyTable(["a/1.jpg"]), ()) is None
