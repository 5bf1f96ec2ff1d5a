"""Durable file writes: the one home of fsync rules (temp file, fsync, rename, fsync of the directory).

A rename reaches the disk before the data it names unless the data was fsynced first, and the
rename itself is durable only once its directory is fsynced (ext4, XFS, btrfs alike; seen on the
emulated board as 0-byte files after a power cut). So every write a later step relies on goes:
write a temp file beside the target, ``fsync`` it, ``rename`` it over the target, ``fsync`` the
directory. :func:`fsync_tree` does the same for a tree another program wrote (``tar``) before it
is checked and renamed into place. Nothing partial is left behind on an error.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_output", "atomic_write_bytes", "atomic_write_text", "fsync_dir", "fsync_file", "fsync_tree",
           "replace_durably"]


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush ``path``'s data and metadata to the disk (raises OSError when it cannot)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory ``path`` durable (a create, rename or unlink in it).

    A file system that refuses to fsync a directory (some network and FUSE ones answer EINVAL)
    is left as it is: there is nothing more a program can do there.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> int:
    """fsync every regular file and directory under ``root`` (deepest first, ``root`` last);
    returns how many files it synced. Links are not followed."""
    count = 0
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                fsync_file(path)
                count += 1
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                fsync_dir(path)
    fsync_dir(root)
    return count


def replace_durably(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace(src, dst)`` and fsync of ``dst``'s directory (and ``src``'s when it differs)."""
    os.replace(src, dst)
    dst_dir = os.path.dirname(os.path.abspath(dst))
    fsync_dir(dst_dir)
    src_dir = os.path.dirname(os.path.abspath(src))
    if src_dir != dst_dir:
        fsync_dir(src_dir)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``, fsync the directory.

    On any exception the temp file is removed and ``path`` is untouched, so a user's earlier
    file survives a failed run.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_output(path, mode) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically and durably."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)
