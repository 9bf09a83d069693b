"""The OpenAI-compatible API: its error shape, request bodies, the video object, and the routes of
``/v1/videos``, ``/v1/images`` and ``/v1/models``."""
