"""Python client: ``dreamrt watch`` (aiortc viewer) and ``dreamrt job`` (httpx), wire API only."""
