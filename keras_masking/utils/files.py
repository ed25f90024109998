"""Atomic writes: a file or a folder appears whole, or not at all.

Every file and folder the package writes goes through these helpers: the
content is written under a temporary name next to its destination
(``.NAME.partial-PID-XXXXXXXX``) and renamed when complete, so a crash (a full
disk, Ctrl-C, a killed job) leaves the previous version or nothing, never half
a file. Temporary folders of a process that died are cleared by the next write
to the same destination.
"""

import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import uuid

# A folder write is refused when the disk has less than this many times the
# estimated bytes free, plus the slack (file system overhead, metadata).
SPACE_MARGIN = 1.05
SPACE_SLACK = 16 * 2**20


def _temporary_name(path):
    path = pathlib.Path(path)
    return path.with_name(f".{path.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")


_LINE_END = re.compile(r"\r\n|\r|\n")


def text_lines(text):
    r"""The lines of a file's text, split where a file's lines end (``\n``, ``\r\n``, ``\r``).

    Not `str.splitlines`, which also splits at U+2028, U+2029, U+0085 and
    form feeds: characters that a line of text, or a string in a JSON line,
    may hold as they are (FewCLUE's iflytek files hold U+2028).

    Args:
        text: str, a file's content.

    Returns:
        list of str, the lines without their ends (a text that ends with a
        line end has no empty last line).

    Example:
    >>> text_lines("a\u2028b\r\nc\n")
    ['a\u2028b', 'c']
    """
    lines = _LINE_END.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


def is_same_or_inside(path, folder):
    """Whether ``path`` is ``folder`` or lies inside it, links resolved.

    Args:
        path: a path (it need not exist).
        folder: a folder.

    Example:
    >>> is_same_or_inside("/data/model/out", "/data/model")
    True
    >>> is_same_or_inside("/data/model2", "/data/model")
    False
    """
    real, source = os.path.realpath(path), os.path.realpath(folder)
    return real == source or real.startswith(source.rstrip(os.sep) + os.sep)


def read_json_object(path, expected):
    """The JSON object in ``path``; a file that does not parse is refused, naming it.

    Args:
        path: the file.
        expected: what the file should be, for the message ("the config.json
            that save_to_preset wrote: copy it again").

    Returns:
        The dict the file holds.

    Raises:
        ValueError: the file is not UTF-8 JSON, or holds no JSON object.

    Example:
    ```python
    backbone.save_to_preset("preset")
    config = read_json_object("preset/config.json", "the preset's config.json")
    ```
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(
            f"{path}: not valid JSON ({error}); the file is truncated or corrupt. "
            f"Expected {expected}."
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: expected a JSON object. Received: a JSON {type(value).__name__}."
        )
    return value


def file_sha256(path):
    """The sha256 hex digest of a file's bytes, read in 1 MiB pieces.

    Args:
        path: a file path.

    Example:
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(delete=False) as file:
    ...     _ = file.write(b"abc")
    >>> file_sha256(file.name)[:16]
    'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for piece in iter(lambda: file.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def write_atomically(path, write, mode="w"):
    """Writes ``path`` through a temporary file next to it, then renames it.

    Args:
        path: the final path (str or `pathlib.Path`).
        write: a callable taking the open temporary file.
        mode: ``"w"`` (UTF-8 text) or ``"wb"``.

    Returns:
        The path, as a `pathlib.Path`.

    Raises:
        OSError: the write failed (a full disk, no permission); its message
            names ``path`` (never the temporary file, which is removed).

    Example:
    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> write_atomically(folder / "a.txt", lambda file: file.write("done")).read_text()
    'done'
    """
    path = pathlib.Path(path)
    temporary = _temporary_name(path)
    try:
        encoding = "utf-8" if "b" not in mode else None
        with open(temporary, mode, encoding=encoding) as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if error.filename not in (None, os.fspath(temporary), temporary):
            raise
        # Errors from inside a write (np.savez, json.dump: a full disk) name
        # no file, and those of open() the temporary one: name the file meant.
        if error.errno is None:
            raise OSError(f"{os.fspath(path)}: {error}") from error
        raise OSError(error.errno, error.strerror or str(error), os.fspath(path)) from error
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def write_json_atomically(path, value):
    """`write_atomically` of a JSON document (UTF-8, not ASCII-escaped, indented).

    Args:
        path: the final path.
        value: a JSON-serialisable value.

    Returns:
        The path, as a `pathlib.Path`.

    Example:
    >>> import tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
    >>> write_json_atomically(path, {"score": 1.0}).read_text().startswith("{")
    True
    """
    return write_atomically(
        path, lambda file: json.dump(value, file, ensure_ascii=False, indent=2, sort_keys=False)
    )


def write_folder_atomically(output, write, needed_bytes=None):
    """Runs ``write(folder)`` on a temporary folder next to ``output``, then
    renames it to ``output``.

    ``output`` must not exist, or be an empty folder (which is replaced). On
    any failure the temporary folder, and the parent folders made for
    ``output``, are removed: ``output`` is as it was.

    Args:
        output: the final folder.
        write: a callable taking the temporary folder's path (a str).
        needed_bytes: optional estimate of the bytes ``write`` writes: a disk
            with less free space (times 1.05, plus 16 MiB) is refused before
            anything is written.

    Returns:
        ``output``, as a `pathlib.Path`.

    Raises:
        OSError: not enough free space (``errno.ENOSPC``), or the write or the
            rename failed.

    Example:
    >>> import tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "preset"
    >>> def write(folder):
    ...     pathlib.Path(folder, "config.json").write_text("{}")
    >>> sorted(p.name for p in write_folder_atomically(target, write).iterdir())
    ['config.json']
    """
    output = pathlib.Path(os.path.abspath(output))
    made = [folder for folder in output.parents if not folder.exists()]
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = None
    try:
        remove_stale_partials(output)
        if needed_bytes is not None:
            check_free_space(output.parent, needed_bytes, output)
        partial = _temporary_name(output)
        partial.mkdir()
        write(os.fspath(partial))
        if output.is_dir():
            output.rmdir()  # empty (checked by the caller); fails if anything appeared
        os.rename(partial, output)
    except BaseException:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        for folder in made:  # the parents made here, deepest first, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return output


def replace_folder_atomically(output, write, needed_bytes=None, keep_other_files=False):
    """`write_folder_atomically` that may replace a non-empty ``output``.

    The new folder is written whole next to ``output``, then swapped in: the
    old one is renamed aside, the new one into place, and the old one
    removed. A process that dies between the two renames leaves the old
    folder aside, and the next write to ``output`` (`remove_stale_partials`)
    puts it back.

    Args:
        output: the final folder.
        write: a callable taking the temporary folder's path (a str).
        needed_bytes: see `write_folder_atomically`.
        keep_other_files: copy the old folder's files and folders that the
            new one does not hold into it (a write into the folder, as
            keras-hub's ``save_to_preset`` makes, whole or not at all); or a
            callable ``keep(name)`` choosing which of them to copy (an old
            file of a set the write replaces as a whole is not).

    Returns:
        ``output``, as a `pathlib.Path`.

    Example:
    >>> import tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (target / "old.txt").write_text("old")
    >>> def write(folder):
    ...     pathlib.Path(folder, "new.txt").write_text("new")
    >>> sorted(p.name for p in replace_folder_atomically(target, write).iterdir())
    ['new.txt']
    """
    output = pathlib.Path(os.path.abspath(output))
    if not (output.is_dir() and any(output.iterdir())):
        return write_folder_atomically(output, write, needed_bytes=needed_bytes)
    remove_stale_partials(output)
    staged = _temporary_name(output)

    def write_and_keep(folder):
        write(folder)
        keep = keep_other_files if callable(keep_other_files) else lambda name: True
        for entry in output.iterdir() if keep_other_files else ():
            target = pathlib.Path(folder, entry.name)
            if target.exists() or entry.name.startswith(f".{output.name}.partial-"):
                continue
            if keep(entry.name):
                copy = shutil.copytree if entry.is_dir() else shutil.copy2
                copy(entry, target)

    write_folder_atomically(staged, write_and_keep, needed_bytes=needed_bytes)
    aside = staged.with_name(staged.name + _ASIDE)
    try:
        os.rename(output, aside)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    try:
        os.rename(staged, output)
    except BaseException:
        os.rename(aside, output)
        shutil.rmtree(staged, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return output


# The suffix of a folder `replace_folder_atomically` moved aside.
_ASIDE = "-old"


def remove_stale_partials(output):
    """Removes the temporary files and folders of ``output`` whose process died.

    A process killed while writing (h5py segfaults when the disk fills up)
    cannot clean up; its ``.NAME.partial-PID-XXXX`` goes with the next write
    to the same output. A folder `replace_folder_atomically` moved aside
    goes back to ``output`` when ``output`` is missing (the process died
    between its renames), and is removed otherwise.

    Args:
        output: the destination whose leftovers to clear.

    Example:
    >>> import tempfile
    >>> remove_stale_partials(pathlib.Path(tempfile.mkdtemp()) / "preset")
    """
    parent, name = os.path.split(os.path.abspath(output))
    prefix = f".{name}.partial-"
    if not os.path.isdir(parent):
        return
    for entry in os.listdir(parent):
        if not entry.startswith(prefix):
            continue
        pid = entry[len(prefix) :].split("-")[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            stale = os.path.join(parent, entry)
            if entry.endswith(_ASIDE) and not os.path.lexists(output):
                os.rename(stale, output)  # the folder a swap had moved aside
            elif os.path.isdir(stale):
                shutil.rmtree(stale, ignore_errors=True)
            else:
                pathlib.Path(stale).unlink(missing_ok=True)


def _process_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


def check_free_space(folder, needed_bytes, output):
    """Raises ``OSError(ENOSPC)`` when ``folder``'s disk cannot hold
    ``needed_bytes`` (times 1.05, plus 16 MiB) for ``output``.

    Args:
        folder: a folder on the disk to check.
        needed_bytes: the bytes the write needs.
        output: the destination, named in the message.

    Example:
    >>> import tempfile
    >>> check_free_space(tempfile.gettempdir(), 1, "out")
    """
    needed = int(needed_bytes * SPACE_MARGIN) + SPACE_SLACK
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"Not enough free space to write {os.fspath(output)!r}: it needs about "
            f"{needed / 2**20:.1f} MiB, its disk has {free / 2**20:.1f} MiB free",
        )
