"""Errors of the HIL rig, as part of the project's tree.

::

    CuvilEdgeError
    └── HilError                 the rig could not do what it was asked
        ├── TargetError          hil/targets.toml: unknown target, bad field
        ├── ImageError           the board image could not be built
        ├── BootError            the board did not reach multi-user.target in its budget
        └── BoardCommandError    a command on the board failed (its exit status and output)
"""

from __future__ import annotations

from cuvil_edge.errors import CuvilEdgeError

__all__ = ["BoardCommandError", "BootError", "HilError", "ImageError", "TargetError"]


class HilError(CuvilEdgeError):
    """The HIL rig could not do what it was asked."""


class TargetError(HilError):
    """A target of ``hil/targets.toml`` is unknown or badly described."""


class ImageError(HilError):
    """The board image could not be built (the message carries the build log's tail)."""


class BootError(HilError):
    """The board did not come up in its budget (the message carries the console's last lines)."""


class BoardCommandError(HilError):
    """A command run on the board exited non-zero."""

    def __init__(self, argv: str, status: int, stdout: str, stderr: str) -> None:
        self.argv, self.status, self.stdout, self.stderr = argv, status, stdout, stderr
        tail = (stderr.strip() or stdout.strip())[-600:]
        super().__init__(f"on the board: `{argv}` exited {status}: {tail}")
