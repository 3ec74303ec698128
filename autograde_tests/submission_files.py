"""A submission's files are data: regular files in folders of the submission's own, never links.

A learner chooses what their submission folder holds. A symbolic link in it (to the instructor's
notebook, the gradebook, another learner's work), a FIFO (a read that never ends) or a device is not
an answer: the grader refuses the submission, says why, and copies nothing. Checking a path and then
opening it would leave a gap in which the file can be swapped for a link, so files are read by opening
every folder on the way and the file itself without following links (``O_NOFOLLOW``) and asking the
open file what it is (``fstat``). Grading and collection (``autograde_tests.exchange``) copy trees this way.
"""

import errno
import fnmatch
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Opening a FIFO for reading waits for a writer: O_NONBLOCK returns at once, and fstat then says what it is.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotData(Exception):
    """A path in a submission that is not a regular file or folder of the submission's own; the message says why."""


def kind(path: Path) -> str:
    """What ``path`` is, as a reason names it: "a symbolic link (to ...)", "a FIFO", "a device", ..."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            pass
    return _mode_kind(mode)


def student_id_problem(student_id: str) -> str | None:
    """Why ``student_id`` cannot name a folder in submitted/ (None when it can).

    A student id becomes a path component: it must never climb (``..``), stay put (``.``), hide, be
    empty, or hold a separator or a control character.
    """
    if not student_id:
        return "the student id is empty"
    if student_id.startswith("."):
        return f"the student id {student_id!r} starts with a dot"
    if any(c in student_id for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in student_id):
        return f"the student id {student_id!r} holds a path separator or a control character"
    if len(student_id) > 100:
        return "the student id is longer than 100 characters"
    return None


def first_non_data(folder: Path, shown: str) -> str | None:
    """Why the submission ``folder`` is not only regular files and folders (named as ``shown``/...), or None.

    A linked folder is named, never entered (``os.walk`` does not follow links).
    """
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        return f"{shown} is {kind(folder)}"
    for here, folders, names in os.walk(folder):
        for name in sorted(folders + names):
            path = Path(here, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return f"{shown}/{path.relative_to(folder)} is {kind(path)}"
    return None


def read_beneath(root: Path, relative: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``root/relative``, no link followed on the way below ``root``.

    ``root`` is the grader's own (the course's submitted/); ``relative`` is what the learner controls.
    NotData when a part of it is a link, the file is not a regular file, or it holds more than ``limit`` bytes.
    """
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or any(p in (".", "..") for p in parts):
        raise NotData(f"{relative} is not a path inside the submission")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if last and not stat.S_ISREG(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                raise NotData(f"{relative} is {kind(root / relative)}")  # refused unopened; fstat closes the race
            try:
                inner = os.open(part, _READ | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    shown = PurePosixPath(*parts[:depth + 1])
                    raise NotData(f"{shown} is {kind(root / shown)}") from None
                raise
            os.close(fd)
            fd = inner
        return _read_open(fd, relative, limit)
    finally:
        os.close(fd)


def _read_open(fd: int, shown: str, limit: int | None) -> bytes:
    """The bytes of the open file ``fd``, which must be a regular file of at most ``limit`` bytes."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise NotData(f"{shown} is {_mode_kind(info.st_mode)}")
    if limit is not None and info.st_size > limit:
        raise NotData(f"{shown} is larger than {limit} bytes")
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 20):
        size += len(chunk)
        if limit is not None and size > limit:  # it grew since fstat
            raise NotData(f"{shown} is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _mode_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a folder" if stat.S_ISDIR(mode) else "a file"


@dataclass(frozen=True)
class Rules:
    """What a tree copy leaves out (nbgrader's CourseDirectory.ignore, include, max_file_size, max_dir_size)."""

    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] = ("*",)
    max_file_kb: float | None = None
    max_dir_kb: float | None = None


def copy_tree(top: Path, dest: Path | None, rules: Rules = Rules(), log=None) -> int:
    """Copy the folder ``top`` to ``dest`` (which must not exist) without following a link; bytes copied.

    With ``dest`` None, only check. NotData at the first link, device, FIFO or socket that the rules do not
    leave out, or when the tree is over ``rules.max_dir_kb``: then nothing is left at ``dest``.
    """
    if not stat.S_ISDIR(os.lstat(top).st_mode):
        raise NotData(f"{top.name} is {kind(top)}")
    if dest is not None:
        dest.mkdir(parents=True)  # before the copy: a failed one then removes only what it made
    total = 0
    try:
        # fwalk opens each folder it enters relative to its parent's descriptor, and checks it is the
        # folder it listed: a folder swapped for a link is not entered.
        for here, folders, names, here_fd in os.fwalk(top, follow_symlinks=False):
            relative = Path(here).relative_to(top)
            folders[:] = [f for f in folders if not _excluded(f, rules)]
            if dest is not None and relative != Path("."):
                (dest / relative).mkdir()
            for name in sorted(folders):
                mode = os.stat(name, dir_fd=here_fd, follow_symlinks=False).st_mode
                if not stat.S_ISDIR(mode):
                    raise NotData(f"{relative / name} is {kind(Path(here, name))}")
            for name in sorted(n for n in names if not _excluded(n, rules)):
                total += _copy_file(here_fd, name, relative / name, dest, rules, log)
                if rules.max_dir_kb and total > 1000 * rules.max_dir_kb:
                    raise NotData(f"{top.name} is larger than {rules.max_dir_kb:g} kB")
    except BaseException:
        if dest is not None:
            shutil.rmtree(dest, ignore_errors=True)
        raise
    return total


def _excluded(name: str, rules: Rules) -> bool:
    return any(fnmatch.fnmatch(name, glob) for glob in rules.exclude)


def _copy_file(dir_fd: int, name: str, relative: Path, dest: Path | None, rules: Rules, log) -> int:
    """Copy one file of a tree (opened without following a link); bytes copied (0 when the rules leave it out)."""
    mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):  # refused unopened (opening a device can do things); fstat below closes the race
        raise NotData(f"{relative} is {_mode_kind(mode)}")
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotData(f"{relative} is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotData(f"{relative} is {_mode_kind(info.st_mode)}")
        if not any(fnmatch.fnmatch(name, glob) for glob in rules.include):
            return 0
        if rules.max_file_kb and info.st_size > 1000 * rules.max_file_kb:
            if log:
                log.warning("Ignoring file too large: %s", relative)
            return 0
        data = _read_open(fd, str(relative), None)
    finally:
        os.close(fd)
    if dest is not None:
        write_new(dest / relative, data)
    return len(data)


def write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to a file that must not exist yet (never through a link planted at ``path``)."""
    fd = os.open(path, _WRITE, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)

