"""One ``dreamrt serve`` setting declared once: a dataclass field whose metadata says its key,
flag and help, read by ``server.config.sources`` for every source (flags, ``DREAMRT_*``
environment variables, a TOML file) and by ``check_choices`` for its allowed values.

A setting's **key** is its name in every source: the TOML key, the environment variable
``DREAMRT_<KEY>`` and (with ``-`` for ``_``) the flag, unless ``flag`` names another one (an
old spelling, kept: ``--bitrate`` for ``video_bitrate_bps``). The key is the field's name
unless ``key`` says otherwise (a group's field named like the group: ``ModelConfig.card`` is
the key ``model``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["ConfigError", "check_choices", "setting"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and the source."""


def setting(
    default: T,
    help: str,
    *,
    key: str = "",
    flag: str | None = "",
    metavar: str | None = None,
    choices: Sequence[str] = (),
    check: bool = True,
    switch_value: object = True,
) -> T:
    """A dataclass field that is a setting (module docstring). ``flag=None``: no flag (code
    and tests only, e.g. the web client's directory). ``choices``: the values allowed in every
    source (``check=False``: the flag lists them, the code that uses the value checks it).
    ``switch_value``: what a bool flag given without a value sets (``--no-warmup``
    sets ``warmup`` False)."""
    meta = {
        "help": help,
        "key": key,
        "flag": flag,
        "metavar": metavar,
        "choices": tuple(choices),
        "check": check,
        "switch_value": switch_value,
    }
    return dataclasses.field(default=default, metadata=meta)


def check_choices(value: DataclassInstance) -> None:
    """``ConfigError`` for a field of the dataclass ``value`` outside its ``choices``."""
    for f in dataclasses.fields(value):
        choices = f.metadata.get("choices")
        got = getattr(value, f.name)
        if choices and f.metadata.get("check", True) and got is not None and got not in choices:
            key = f.metadata.get("key") or f.name
            raise ConfigError(f"{key}={got!r}; expected one of {', '.join(choices)}")
