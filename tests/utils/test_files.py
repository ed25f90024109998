"""Atomic writes: a failure leaves the old version or nothing, errors name the
final path, leftovers of dead processes go, a small disk is refused first."""

import collections
import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest

from keras_masking.utils import files
from keras_masking.utils.files import check_free_space
from keras_masking.utils.files import remove_stale_partials
from keras_masking.utils.files import replace_folder_atomically
from keras_masking.utils.files import write_atomically
from keras_masking.utils.files import write_folder_atomically
from keras_masking.utils.files import write_json_atomically


def _names(folder):
    return sorted(path.name for path in pathlib.Path(folder).iterdir())


def _dead_pid():
    """The id of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_a_text_and_a_binary_file_are_written_whole(tmp_path):
    text = write_atomically(tmp_path / "a.txt", lambda file: file.write("ünïcode"))
    assert text == tmp_path / "a.txt" and text.read_text(encoding="utf-8") == "ünïcode"
    binary = write_atomically(tmp_path / "b.bin", lambda file: file.write(b"\x00\x01"), mode="wb")
    assert binary.read_bytes() == b"\x00\x01"
    assert _names(tmp_path) == ["a.txt", "b.bin"]  # no temporary file left


def test_a_failed_write_keeps_the_old_version_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "scores.json"
    path.write_text("old")

    def fail(file):
        file.write("half of the new")
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        write_atomically(path, fail)
    assert path.read_text() == "old" and _names(tmp_path) == ["scores.json"]
    with pytest.raises(KeyboardInterrupt):
        write_atomically(
            tmp_path / "new.txt", lambda file: (_ for _ in ()).throw(KeyboardInterrupt)
        )
    assert _names(tmp_path) == ["scores.json"]


def test_an_error_inside_the_write_names_the_final_path(tmp_path):
    path = tmp_path / "weights.npz"

    def full_disk(file):
        raise OSError("No space left on device")  # no errno, no file name

    with pytest.raises(OSError, match=f"{path}: No space left on device"):
        write_atomically(path, full_disk)

    def full_disk_with_errno(file):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as raised:
        write_atomically(path, full_disk_with_errno)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == os.fspath(path)
    assert _names(tmp_path) == []


def test_a_missing_folder_is_named_not_the_temporary_file(tmp_path):
    path = tmp_path / "missing" / "a.txt"
    with pytest.raises(FileNotFoundError) as raised:
        write_atomically(path, lambda file: file.write("x"))
    assert raised.value.filename == os.fspath(path)
    assert ".partial-" not in str(raised.value)


def test_an_error_about_another_file_is_passed_on_unchanged(tmp_path):
    other = tmp_path / "source.txt"

    def read_other(file):
        file.write(other.read_text())  # FileNotFoundError naming source.txt

    with pytest.raises(FileNotFoundError) as raised:
        write_atomically(tmp_path / "copy.txt", read_other)
    assert raised.value.filename == os.fspath(other)
    assert _names(tmp_path) == []


def test_json_is_utf8_indented_and_keeps_the_key_order(tmp_path):
    value = collections.OrderedDict([("z", 1.5), ("任务", "ok")])
    path = write_json_atomically(tmp_path / "a.json", value)
    text = path.read_text(encoding="utf-8")
    assert "任务" in text and text.startswith('{\n  "z"')
    assert json.loads(text) == dict(value)
    with pytest.raises(TypeError):
        write_json_atomically(path, {"bad": object()})
    assert json.loads(path.read_text(encoding="utf-8")) == dict(value)  # the old version


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    output = tmp_path / "out" / "preset"

    def write(folder):
        pathlib.Path(folder, "config.json").write_text("{}")
        pathlib.Path(folder, "model.weights.h5").write_bytes(b"w")

    assert write_folder_atomically(output, write) == output
    assert _names(output) == ["config.json", "model.weights.h5"]
    assert _names(output.parent) == ["preset"]

    def fail(folder):
        pathlib.Path(folder, "config.json").write_text("{}")
        raise RuntimeError("stopped")

    second = tmp_path / "out" / "second"
    with pytest.raises(RuntimeError, match="stopped"):
        write_folder_atomically(second, fail)
    assert _names(output.parent) == ["preset"]  # neither the folder nor its partial
    # The parents it made go with it (`keras-masking correct-embeddings` refused into
    # a/b/out left a/b); the ones that were there stay.
    with pytest.raises(RuntimeError, match="stopped"):
        write_folder_atomically(tmp_path / "a" / "b" / "out", fail)
    assert not (tmp_path / "a").exists() and (tmp_path / "out").is_dir()


def test_an_empty_folder_is_replaced_and_a_full_one_is_kept(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    write_folder_atomically(empty, lambda folder: pathlib.Path(folder, "a").write_text("a"))
    assert _names(empty) == ["a"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "old").write_text("old")
    with pytest.raises(OSError):
        write_folder_atomically(full, lambda folder: pathlib.Path(folder, "new").write_text("x"))
    assert _names(full) == ["old"] and _names(tmp_path) == ["empty", "full"]


def test_partials_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    output = tmp_path / "preset"
    dead, alive = _dead_pid(), os.getpid()
    stale_folder = tmp_path / f".preset.partial-{dead}-0123abcd"
    stale_folder.mkdir()
    (stale_folder / "model.weights.h5").write_bytes(b"half")
    stale_file = tmp_path / f".preset.partial-{dead}-89abcdef"
    stale_file.write_text("half")
    live = tmp_path / f".preset.partial-{alive}-00000000"
    live.mkdir()
    other = tmp_path / f".other.partial-{dead}-00000000"  # another destination's
    other.mkdir()
    remove_stale_partials(output)
    assert _names(tmp_path) == sorted([live.name, other.name])
    remove_stale_partials(tmp_path / "missing" / "preset")  # no folder: nothing to do
    # A folder write clears its destination's leftovers first.
    stale_folder.mkdir()
    write_folder_atomically(output, lambda folder: None)
    assert _names(tmp_path) == sorted([live.name, other.name, "preset"])


def test_a_full_folder_is_replaced_whole_or_kept_as_it_was(tmp_path):
    output = tmp_path / "preset"
    output.mkdir()
    (output / "config.json").write_text("old")
    (output / "notes.txt").write_text("mine")

    def write(folder):
        pathlib.Path(folder, "config.json").write_text("new")

    def fail(folder):
        write(folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        replace_folder_atomically(output, fail, keep_other_files=True)
    assert (output / "config.json").read_text() == "old" and _names(tmp_path) == ["preset"]
    replace_folder_atomically(output, write, keep_other_files=True)  # a write into the folder
    assert _names(output) == ["config.json", "notes.txt"] and _names(tmp_path) == ["preset"]
    assert (output / "config.json").read_text() == "new"
    replace_folder_atomically(output, write)  # a replacement
    assert _names(output) == ["config.json"]


def test_a_folder_a_dead_swap_moved_aside_comes_back(tmp_path):
    """A process that died between a swap's two renames left the old folder aside and
    no output: the next write puts the old folder back (and then replaces it whole)."""
    output = tmp_path / "export"
    aside = tmp_path / f".export.partial-{_dead_pid()}-0123abcd-old"
    aside.mkdir()
    (aside / "notes.txt").write_text("mine")
    remove_stale_partials(output)
    assert _names(tmp_path) == ["export"] and (output / "notes.txt").read_text() == "mine"
    # Once the output is back in place, a folder left aside is a leftover.
    aside.mkdir()
    remove_stale_partials(output)
    assert _names(tmp_path) == ["export"]


def test_a_disk_without_room_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(files.shutil, "disk_usage", lambda folder: usage(0, 0, 40 * 2**20))
    needed = 23 * 2**20  # 23 MiB * 1.05 + 16 MiB > 40 MiB
    with pytest.raises(OSError, match="Not enough free space to write '.*preset'") as raised:
        check_free_space(tmp_path, needed, tmp_path / "preset")
    assert raised.value.errno == errno.ENOSPC
    check_free_space(tmp_path, 20 * 2**20, tmp_path / "preset")  # 37 MiB fits

    written = []
    with pytest.raises(OSError, match="needs about 40.1 MiB, its disk has 40.0 MiB free"):
        write_folder_atomically(tmp_path / "preset", written.append, needed_bytes=needed)
    assert not written and _names(tmp_path) == []
