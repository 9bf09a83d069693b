"""Products: FastAPI app (REST, SSE), WebRTC signalling, metrics, CLI."""
