"""A small async REST client for dreamrt (httpx). Speaks only the wire format of docs/api.md.

Every call raises ``ApiCallError`` (status, code, message, ``retry_after_s``) on a non-2xx
answer, so callers can tell capacity (503 + Retry-After) from mistakes (4xx).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import httpx

__all__ = ["ApiCallError", "DreamrtClient"]


class ApiCallError(RuntimeError):
    def __init__(
        self, status: int, code: str, message: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


class DreamrtClient:
    """``async with DreamrtClient(url, token=...) as api: ...``; session tokens are used for the
    session's own routes once ``create_session`` returned one."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s)
        self._session_tokens: dict[str, str] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, session_id: str | None = None) -> dict[str, str]:
        token = self._session_tokens.get(session_id or "", self.token) if session_id else self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def request(
        self, method: str, path: str, *, session_id: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {**self._headers(session_id), **kwargs.pop("headers", {})}
        response = await self._http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"detail": response.text}
            if isinstance(body.get("error"), dict):  # the OpenAI-compatible routes' shape
                error = body["error"]
                body = {"detail": error.get("message", ""), "code": error.get("code") or "error"}
            detail = body.get("detail", "")
            message = (
                detail
                if isinstance(detail, str)
                else "; ".join(
                    f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail
                )
            )
            retry = response.headers.get("retry-after")
            raise ApiCallError(
                response.status_code,
                body.get("code", "error"),
                message,
                float(retry) if retry else None,
            )
        return response

    async def health(self) -> dict[str, Any]:
        return (await self.request("GET", "/healthz")).json()

    async def models(self) -> list[dict[str, Any]]:
        """Every card of the server (``GET /v1/models`` answers OpenAI's list shape)."""
        return (await self.request("GET", "/v1/models")).json()["data"]

    async def create_session(self, prompt: str, **params: Any) -> dict[str, Any]:
        body = {"prompt": prompt, **{k: v for k, v in params.items() if v is not None}}
        created = (await self.request("POST", "/v1/sessions", json=body)).json()
        self._session_tokens[created["id"]] = created["token"]
        return created

    async def session(self, session_id: str) -> dict[str, Any]:
        return (
            await self.request("GET", f"/v1/sessions/{session_id}", session_id=session_id)
        ).json()

    async def offer(self, session_id: str, sdp: str) -> dict[str, Any]:
        body = {"sdp": sdp, "type": "offer"}
        return (
            await self.request(
                "POST", f"/v1/sessions/{session_id}/offer", session_id=session_id, json=body
            )
        ).json()

    async def prompt(self, session_id: str, text: str, mode: str = "switch") -> dict[str, Any]:
        body = {"text": text, "mode": mode}
        return (
            await self.request(
                "POST", f"/v1/sessions/{session_id}/prompt", session_id=session_id, json=body
            )
        ).json()

    async def actions(
        self, session_id: str, keys: list[str], mouse: tuple[float, float] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = (
            {"keys": keys} if mouse is None else {"keys": keys, "mouse": list(mouse)}
        )
        return (
            await self.request(
                "POST", f"/v1/sessions/{session_id}/actions", session_id=session_id, json=body
            )
        ).json()

    async def audio(
        self, session_id: str, body: bytes, content_type: str = "application/octet-stream"
    ) -> dict[str, Any]:
        return (
            await self.request(
                "POST",
                f"/v1/sessions/{session_id}/audio",
                session_id=session_id,
                content=body,
                headers={"Content-Type": content_type},
            )
        ).json()

    async def delete_session(self, session_id: str) -> None:
        await self.request("DELETE", f"/v1/sessions/{session_id}", session_id=session_id)

    async def submit_job(self, task: str, prompt: str, **params: Any) -> str:
        body = {
            "task": task,
            "prompt": prompt,
            **{k: v for k, v in params.items() if v is not None},
        }
        return (await self.request("POST", "/v1/jobs", json=body)).json()["id"]

    async def job(self, job_id: str) -> dict[str, Any]:
        return (await self.request("GET", f"/v1/jobs/{job_id}")).json()

    async def download_artifact(self, job_id: str, out: Path) -> tuple[str, int]:
        """Streams the artifact to ``out``; returns (media type, bytes written)."""
        written = 0
        async with self._http.stream(
            "GET", f"/v1/jobs/{job_id}/artifact", headers=self._headers()
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise ApiCallError(response.status_code, "artifact", response.text)
            with out.open("wb") as f:
                async for part in response.aiter_bytes():
                    f.write(part)
                    written += len(part)
            return response.headers.get("content-type", ""), written
