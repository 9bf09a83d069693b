"""Python client: ``dreamrt watch`` (aiortc viewer) and ``dreamrt job`` (httpx), on the wire API only."""
