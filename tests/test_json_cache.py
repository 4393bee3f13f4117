"""The JSON caches: forgiving reads, atomic writes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specdec_cli.json_cache import read_json_cache, update_json_cache, write_json_cache


def test_what_is_written_is_read_back(tmp_path):
    cache = tmp_path / "deeper" / "cache.json"
    write_json_cache(cache, {"a": 1, "b": [2, 3]})
    assert read_json_cache(cache) == {"a": 1, "b": [2, 3]}
    assert os.listdir(cache.parent) == ["cache.json"]  # no temporary file left


@pytest.mark.parametrize("text", [None, "{not json", "[1, 2]"])
def test_a_missing_or_damaged_cache_reads_as_empty(tmp_path, text):
    cache = tmp_path / "cache.json"
    if text is not None:
        cache.write_text(text)
    assert read_json_cache(cache) == {}


def test_a_failed_write_leaves_the_old_cache_whole(tmp_path, monkeypatch):
    cache = tmp_path / "cache.json"
    write_json_cache(cache, {"old": 1})
    renamed = []

    def refuse(source, destination):
        renamed.append(os.path.basename(source))
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    write_json_cache(cache, {"new": 2})  # no error: a cache is only a cache
    assert read_json_cache(cache) == {"old": 1}
    assert renamed == [f"cache.json.{os.getpid()}.tmp"]  # this process's own name
    assert os.listdir(tmp_path) == ["cache.json"]


def test_an_unwritable_folder_is_not_an_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    write_json_cache(blocked / "cache.json", {"a": 1})  # its folder is a file
    assert read_json_cache(blocked / "cache.json") == {}


# Each writer adds its keys one update at a time: half of them, then it says so (a file) and
# waits until the other has done its half too, then the rest. So each one's updates come
# both before and after some of the other's: the two really overlap.
WRITER = """
import sys, time
from pathlib import Path
from specdec_cli.json_cache import update_json_cache

cache, name, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
halfway = cache.parent / f"{name}-halfway"
other_halfway = cache.parent / f"{other}-halfway"
for i in range(60):
    if i == 30:
        halfway.touch()
        deadline = time.monotonic() + 60
        while not other_halfway.exists():
            if time.monotonic() > deadline:
                sys.exit("the other writer never got halfway")
            time.sleep(0.001)
    update_json_cache(cache, lambda entries: entries.update({f"{name}{i}": i}))
"""


def test_two_processes_updating_at_once_lose_neither_ones_keys(tmp_path):
    cache = tmp_path / "cache.json"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(cache), name, other])
        for name, other in (("a", "b"), ("b", "a"))
    ]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    assert read_json_cache(cache) == {f"{name}{i}": i for name in "ab" for i in range(60)}


def test_an_update_changes_only_what_it_touches(tmp_path):
    cache = tmp_path / "cache.json"
    write_json_cache(cache, {"theirs": 1, "ours": 1})
    update_json_cache(cache, lambda entries: entries.update(ours=2))
    assert read_json_cache(cache) == {"theirs": 1, "ours": 2}
