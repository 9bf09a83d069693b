"""Products: the FastAPI app and its composition root, the ``dreamrt`` CLI, and a package per edge
(REST API, OpenAI API, WebRTC, LiveKit, fleet, router, operations)."""
