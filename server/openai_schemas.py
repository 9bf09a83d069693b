"""Request bodies of the OpenAI-compatible routes (docs/api.md "OpenAI-compatible API").

Unknown fields are refused like everywhere else (a 400 naming the field, OpenAI's answer to a
parameter it does not know). ``POST /v1/videos`` arrives as JSON or as multipart/form-data (the
official client always sends the latter), so its route reads the body itself and validates the
fields with ``VideoBody``; ``VIDEO_REQUEST_BODY`` documents both forms in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from server.schemas import ModelInfo, Text

__all__ = ["VIDEO_REQUEST_BODY", "ImageBody", "ModelList", "ModelObject", "VideoBody"]


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


def _video_form_schema() -> dict[str, Any]:
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
