"""asyncssh, imported once for the whole deploy package without cryptography's DSA warning.

cryptography 51 warns (``CryptographyDeprecationWarning``, a UserWarning) whenever DSA key types
are named; asyncssh 2.24 names them at import to build its key-type unions, so every
``cuvil-edge deploy`` printed three warning lines about an algorithm we never use, and a test run
with warnings as errors could not import it at all. The filter is scoped to this one import and
that one message: any other warning still shows.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated", category=UserWarning)
    import asyncssh

__all__ = ["asyncssh"]
