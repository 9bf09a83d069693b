"""Request bodies of the OpenAI-compatible routes (docs/api.md "OpenAI-compatible API").

Unknown fields are refused like everywhere else (a 400 naming the field, OpenAI's answer to a
parameter it does not know). ``POST /v1/videos`` arrives as JSON or as multipart/form-data (the
official client always sends the latter), so its route reads the body itself
(``read_video_body``, shared with the fleet router) and validates the fields with
``VideoBody``; ``VIDEO_REQUEST_BODY`` documents both forms in the OpenAPI schema.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from server.edge.schemas import ModelInfo, Text
from server.openai.errors import from_validation, invalid

__all__ = [
    "VIDEO_REQUEST_BODY",
    "ImageBody",
    "ModelList",
    "ModelObject",
    "VideoBody",
    "read_video_body",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VideoBody(_Body):
    prompt: Text
    model: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    # a string of a positive integer (the client sends "4"); an integer is taken too
    seconds: Annotated[str, Field(max_length=16)] | int | None = None
    size: Annotated[str, Field(max_length=32)] | None = None  # "WxH"
    # an upload (multipart) or {"image_url"} / {"file_id"} (JSON): refused unless the card
    # conditions on an image
    input_reference: Any = None


class ImageBody(_Body):
    prompt: Text
    model: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    n: Annotated[int, Field(ge=1, le=4)] | None = 1
    size: Annotated[str, Field(max_length=32)] | None = None
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png"] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None  # an end-user id; not used


_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_video_body(request: Request) -> VideoBody:
    """The body of ``POST /v1/videos``, JSON or a form; a field given twice, a body that is
    neither, or a field that does not validate is a 400 naming it."""
    if request.headers.get("content-type", "").startswith(_FORMS):
        try:
            form = await request.form()
        except Exception as exc:  # noqa: BLE001 - the multipart parser's own errors
            raise invalid("body", f"the form could not be read: {exc}") from None
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key in fields:
                raise invalid(key, f"{key} is given more than once")
            fields[key] = value
        await form.close()
    else:
        try:
            fields = json.loads(await request.body() or b"null")
        except ValueError:
            raise invalid("body", "the body is neither JSON nor a form") from None
        if not isinstance(fields, dict):
            raise invalid("body", "the body must be a JSON object")
    try:
        return VideoBody.model_validate(fields)
    except ValidationError as exc:
        raise from_validation(exc.errors()) from None


def _video_form_schema() -> dict[str, object]:
    schema = VideoBody.model_json_schema()
    schema["properties"]["input_reference"] = {"type": "string", "format": "binary"}
    return schema


VIDEO_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": VideoBody.model_json_schema()},
            "multipart/form-data": {"schema": _video_form_schema()},
        },
    }
}


class ModelObject(ModelInfo):
    """One card in OpenAI's model shape: ``object``, ``created``, ``owned_by`` beside the
    card's fields (``ModelInfo``)."""

    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelObject]
