"""The tiny random Wan model, loaded once for the host tests (sessions and jobs)."""

from __future__ import annotations

import pytest

from models import registry
from models.instance import load_instance

TINY_MODEL = "wan-tiny-random"


@pytest.fixture(scope="package")
def instance():
    return load_instance(registry.get(TINY_MODEL), device="cpu")
