"""In-process app fixtures for the REST tests (the lifespan builds the real engine and model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import ServerConfig, create_app


def make_client(tmp_path: Path, **overrides) -> TestClient:
    config = ServerConfig.of(data_dir=tmp_path / "data", device="cpu", web_dir=None, **overrides)
    return TestClient(create_app(config))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path, max_sessions=2) as test_client:
        yield test_client
