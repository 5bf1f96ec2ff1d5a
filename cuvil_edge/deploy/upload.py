"""Resumable, verified upload of one file to a device over SFTP.

The file goes to ``<final>.part``. An interrupted upload leaves that partial file; the next
upload checks the partial file's sha256 on the device against the same prefix of the local file
and continues from its size (or starts over when they differ). When every byte is there the
device computes the sha256 of the whole file; a mismatch removes the partial file and fails the
upload ("corrupted upload rejected"), a match renames it to ``<final>``, which is never
half-written. The file goes in segments of a few MiB, one after the other (asyncssh pipelines
the requests inside a segment), so after a cut everything below the last segment boundary is
on the device and the upload continues from there.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.errors import DeployError

__all__ = ["CorruptUpload", "UploadResult", "file_sha256", "upload_resumable"]

CHUNK = 1 << 20
SEGMENT = 4 << 20


class CorruptUpload(DeployError):
    """The uploaded file's sha256 on the device did not match; the upload was discarded."""


@dataclass
class UploadResult:
    sent: int  # bytes sent in this call
    resumed_from: int  # size of the partial file that was continued (0: fresh or restarted)
    skipped: bool  # the verified file was already on the device
    restarted: bool  # a partial file was there but did not match and was discarded


def file_sha256(path: Path, limit: int | None = None) -> str:
    """sha256 of a local file, or of its first ``limit`` bytes."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while True:
            n = CHUNK * 4 if left is None else min(CHUNK * 4, left)
            if n == 0:
                break
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


async def upload_resumable(
    tr: Transport,
    local: Path,
    final: str,
    sha256: str,
    progress: Callable[[int, int], None] | None = None,
    segment: int = SEGMENT,
) -> UploadResult:
    """Upload ``local`` to ``final`` on the device, resuming a partial upload; verify by sha256.

    Args:
        tr (Transport): connected transport.
        local (Path): the file to send.
        final (str): device path of the verified file.
        sha256 (str): the local file's sha256 (hex).
        progress (Callable[[int, int], None]): called with (bytes on device, total). Defaults to None.
        segment (int): bytes written (pipelined) before the next segment starts; a resumed upload
            continues from the last complete segment. Defaults to 4 MiB.

    Raises:
        CorruptUpload: the device's sha256 of the complete file differs; the file was removed.
        DeployError: transport failures (the partial file stays for the next attempt).
    """
    size = local.stat().st_size
    part = final + ".part"
    await tr.makedirs(os.path.dirname(final))
    st = await tr.stat(final)
    if st is not None:
        if st.size == size and await tr.sha256(final) == sha256:
            if progress:
                progress(size, size)
            return UploadResult(0, 0, True, False)
        await tr.remove(final)
    offset = 0
    restarted = False
    st = await tr.stat(part)
    if st is not None and st.size:
        # Segments are written one after another, so everything below the last segment
        # boundary is complete; cut the partial file there and check that prefix.
        offset = min(int(st.size), size) // segment * segment
        if offset and offset != st.size:
            await _truncate(tr, part, offset)
        if offset and await tr.sha256(part) != await asyncio.to_thread(file_sha256, local, offset):
            offset = 0
            restarted = True
    resumed_from = offset
    if progress:
        progress(offset, size)
    f = await tr.open(part, "r+b" if offset else "wb")
    sent = 0
    try:
        with open(local, "rb") as src:
            src.seek(offset)
            pos = offset
            while pos < size:
                block = await asyncio.to_thread(src.read, segment)
                if not block:
                    break
                # asyncssh pipelines the requests of one segment; the next waits for all of them.
                await f.write(block, pos)
                pos += len(block)
                sent += len(block)
                if progress:
                    progress(pos, size)
    except DeployError:
        raise
    except Exception as exc:
        raise tr.error("upload", part, exc) from exc
    finally:
        try:
            await f.close()
        except Exception:  # the connection is gone; the partial file stays on the device
            pass
    got = await tr.sha256(part)
    if got != sha256:
        await tr.remove(part)
        raise CorruptUpload(
            f"{tr.address.label}: corrupted upload rejected: {part} has sha256 {got[:16]}…, "
            f"expected {sha256[:16]}…; removed it, deploy again to resend"
        )
    await tr.rename(part, final)
    return UploadResult(sent, resumed_from, False, restarted)


async def _truncate(tr: Transport, path: str, size: int) -> None:
    f = await tr.open(path, "r+b")
    try:
        await f.truncate(size)
    except Exception as exc:
        raise tr.error("truncate", path, exc) from exc
    finally:
        await f.close()
