"""What every end-to-end test needs: aioice offers the loopback address as its only host
candidate (without this it offers none on loopback), so the aiortc peers of a test connect on
127.0.0.1 and never anywhere else."""

from __future__ import annotations

import aioice.ice
import pytest


@pytest.fixture(autouse=True)
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
