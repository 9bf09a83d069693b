"""FastAPI application factory (the composition root builds the engine here)."""

from __future__ import annotations

from fastapi import FastAPI


def create_app(*, model: str | None = None, device: str = "auto") -> FastAPI:
    app = FastAPI(title="dreamrt")
    resolved_device = "cpu" if device == "auto" else device

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "model": model or "default", "device": resolved_device}

    return app
