"""A fault-injecting file-system layer for durability tests: what a power cut keeps of a tree.

:class:`FaultFS` wraps ``os.fsync``, ``os.rename`` and ``os.replace`` (through pytest's
monkeypatch), records every call under its root, and :meth:`FaultFS.power_cut` then rewrites the
real tree to what a journaling file system (ext4 with ``data=ordered``, as on Jetson boards and
the emulated board) guarantees after a cut, no more:

- a file's data is on the disk only when it was fsynced after its last change (``tar`` writing it
  counts as a change); otherwise it is cut to 0 bytes (seen on the emulated board after
  ``tar`` + rename without fsync);
- a rename is on the disk only when the destination's directory was fsynced after it; otherwise it
  is undone (the old target comes back);
- a directory's entries are those it had at its last fsync (or when the test started); entries
  created since are gone.

Nothing here is a mock of the code under test: the tree is real, ``tar`` runs, the code's own
calls decide what survives. Removing one fsync the design needs makes a test fail.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class _Rename:
    seq: int
    src: str
    dst: str
    old: tuple[str, Any] | None  # what dst was before: ("file", bytes) | ("link", target) | None
    dst_dir: tuple[int, int]


@dataclass
class FaultFS:
    root: Path
    calls: list[tuple[str, str]] = field(default_factory=list)
    _seq: int = 0
    _synced: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    _listing: dict[tuple[int, int], set[str]] = field(default_factory=dict)  # by (dev, inode): a rename keeps it
    _dir_synced_at: dict[tuple[int, int], int] = field(default_factory=dict)
    _renames: list[_Rename] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(os.path.realpath(self.root))
        self._real_fsync = os.fsync
        self._real_rename = os.rename
        self._real_replace = os.replace
        self.baseline()

    # ------------------------------------------------------------------ recording

    def _mine(self, path: str) -> bool:
        return path == str(self.root) or path.startswith(str(self.root) + os.sep)

    def baseline(self) -> None:
        """Everything now in the tree counts as on the disk."""
        self._synced.clear()
        self._listing.clear()
        for folder, _dirs, files in os.walk(self.root):
            self._listing[_ident(folder)] = set(os.listdir(folder))
            for name in files:
                self._note_data(os.path.join(folder, name))

    def _note_data(self, path: str) -> None:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            self._synced[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns)

    def install(self, monkeypatch: Any) -> FaultFS:
        monkeypatch.setattr(os, "fsync", self.fsync)
        monkeypatch.setattr(os, "rename", self.rename)
        monkeypatch.setattr(os, "replace", self.replace)
        return self

    def fsync(self, fd: int) -> None:
        self._real_fsync(fd)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if not self._mine(path):
            return
        self._seq += 1
        self.calls.append(("fsync", path))
        if os.path.isdir(path):
            self._listing[_ident(path)] = set(os.listdir(path))
            self._dir_synced_at[_ident(path)] = self._seq
        else:
            self._note_data(path)

    def _old(self, dst: str) -> tuple[str, Any] | None:
        if os.path.islink(dst):
            return ("link", os.readlink(dst))
        if os.path.isfile(dst):
            return ("file", Path(dst).read_bytes())
        return None

    def _move(self, real: Any, src: Any, dst: Any, kind: str) -> None:
        s, d = os.path.realpath(os.path.dirname(os.path.abspath(src))), os.path.realpath(
            os.path.dirname(os.path.abspath(dst)))
        s = os.path.join(s, os.path.basename(os.fspath(src)))
        d = os.path.join(d, os.path.basename(os.fspath(dst)))
        if not (self._mine(s) or self._mine(d)):
            real(src, dst)
            return
        old = self._old(d)
        real(src, dst)
        self._seq += 1
        self.calls.append((kind, f"{s} -> {d}"))
        self._renames.append(_Rename(self._seq, s, d, old, _ident(os.path.dirname(d))))

    def rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move(self._real_rename, src, dst, "rename")

    def replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move(self._real_replace, src, dst, "replace")

    def fsynced(self, path: str | os.PathLike[str]) -> bool:
        p = os.path.realpath(path)
        return any(kind == "fsync" and where == p for kind, where in self.calls)

    # ------------------------------------------------------------------ the cut

    def power_cut(self) -> list[str]:
        """Rewrite the tree to what survives a cut now; returns what was lost, for messages."""
        lost: list[str] = []
        for r in reversed(self._renames):
            if self._dir_synced_at.get(r.dst_dir, 0) > r.seq:
                continue
            lost.append(f"rename {r.src} -> {r.dst}")
            if os.path.lexists(r.dst) and os.path.isdir(os.path.dirname(r.src)) and not os.path.lexists(r.src):
                self._real_rename(r.dst, r.src)
            if r.old is not None:
                kind, value = r.old
                if os.path.lexists(r.dst):
                    _remove(r.dst)
                if kind == "link":
                    os.symlink(value, r.dst)
                else:
                    Path(r.dst).write_bytes(value)
                    self._note_data(r.dst)
        self._renames.clear()
        for folder, dirs, files in os.walk(self.root, topdown=True):
            durable = self._listing.get(_ident(folder), set())
            for name in sorted(set(dirs + files) | set(_links(folder))):
                if name not in durable:
                    _remove(os.path.join(folder, name))
                    lost.append(f"entry {os.path.join(folder, name)}")
            dirs[:] = [d for d in dirs if d in durable and not os.path.islink(os.path.join(folder, d))]
        for folder, _dirs, files in os.walk(self.root):
            for name in files:
                path = os.path.join(folder, name)
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                if self._synced.get((st.st_dev, st.st_ino)) != (st.st_size, st.st_mtime_ns) and st.st_size:
                    os.truncate(path, 0)
                    lost.append(f"data {path}")
        self.baseline()
        return lost


def _ident(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return (st.st_dev, st.st_ino)


def _links(folder: str) -> list[str]:
    return [n for n in os.listdir(folder) if os.path.islink(os.path.join(folder, n))]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
