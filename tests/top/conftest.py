"""The serving tests' fixtures (real bundles, the real daemon as a subprocess), shared with ``top``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "daemon" / "conftest.py"
_spec = importlib.util.spec_from_file_location("cuvil_daemon_fixtures", _path)
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _fixtures
_spec.loader.exec_module(_fixtures)

Daemon = _fixtures.Daemon
daemon_factory = _fixtures.daemon_factory
digits_data = _fixtures.digits_data
digits_model = _fixtures.digits_model
store = _fixtures.store
