"""The engine store, re-exported from :mod:`cuvil_edge.bundle.engine_store`.

The store's layout and records are a host-device contract and live in the bundle package, so the
daemon, the runtime and deploy read them without importing the packager; this module keeps the
old import path working.
"""

from __future__ import annotations

from cuvil_edge.bundle.engine_store import (
    RECORD_FORMAT,
    EngineError,
    EngineRecord,
    EngineStore,
    host_engine_cache,
    key_for_facts,
    plan_matches_key,
    sha256_bytes,
    sha256_file,
)

__all__ = [
    "RECORD_FORMAT",
    "EngineError",
    "EngineRecord",
    "EngineStore",
    "host_engine_cache",
    "key_for_facts",
    "plan_matches_key",
    "sha256_bytes",
    "sha256_file",
]
