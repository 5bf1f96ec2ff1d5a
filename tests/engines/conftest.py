"""Fixtures for the engine tests (helpers in ``engine_harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import Board, make_engine_bundle, make_key, second_model


@pytest.fixture(scope="session")
def engine_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from cuvil_edge.bundle.signing import generate_keypair

    d = tmp_path_factory.mktemp("engine-keys")
    generate_keypair(d / "sign.key", d / "sign.pub")
    make_key(d / "client_ed25519")
    return {"secret": d / "sign.key", "public": d / "sign.pub", "client": d / "client_ed25519"}


@pytest.fixture(scope="session")
def engine_bundles(tmp_path_factory: pytest.TempPathFactory, engine_keys: dict[str, Path]) -> dict[str, Path]:
    from cuvil_edge.models import build_digits_cnn

    d = tmp_path_factory.mktemp("engine-bundles")
    sk = engine_keys["secret"]
    return {"v1": make_engine_bundle(d / "digits-1.0.0.cvb", sk, "1.0.0", build_digits_cnn()),
            "v2": make_engine_bundle(d / "digits-2.0.0.cvb", sk, "2.0.0", second_model(d / "digits-b.onnx"))}


@pytest.fixture()
def board(tmp_path: Path, engine_keys: dict[str, Path]) -> Iterator[Board]:
    b = Board(tmp_path, engine_keys)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture()
def host_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh host engine cache for this test (never the user's ~/.cache)."""
    path = tmp_path / "host-engine-cache"
    monkeypatch.setenv("CUVIL_EDGE_ENGINE_CACHE", str(path))
    return path
