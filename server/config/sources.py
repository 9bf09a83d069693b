"""Where a ``ServerConfig`` comes from: ``dreamrt serve`` flags, ``DREAMRT_*`` environment
variables and a TOML file (``--config FILE`` or ``$DREAMRT_CONFIG``), in that precedence over
the defaults (docs/configuration.md). Every source reads the same settings
(``server.config.serve.KEYS``, declared once in ``server.config.fields``) and yields flat
``key -> value``; ``load_config`` merges them and ``ServerConfig.of`` checks the result, so a
value is checked the same wherever it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

from server.config.fields import ConfigError
from server.config.serve import GROUPS, KEYS, ServerConfig

__all__ = [
    "ENV_PREFIX",
    "Setting",
    "add_config_arguments",
    "env_values",
    "file_values",
    "flag_values",
    "load_config",
    "settings",
]

ENV_PREFIX = "DREAMRT_"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting as every source sees it."""

    key: str
    kind: type  # str, int, float, bool or Path (of each item, for a list)
    many: bool  # a list: the flag repeats, the file takes an array
    optional: bool
    default: object
    help: str
    flag: str | None
    metavar: str | None
    choices: tuple[str, ...]
    switch_value: object

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def dest(self) -> str:
        assert self.flag is not None
        return self.flag.lstrip("-").replace("-", "_")

    def parse(self, text: str, source: str) -> object:
        """``text`` (a flag's or variable's value) as this setting's value."""
        try:
            return _scalar(self.kind, text)
        except ValueError:
            raise ConfigError(f"{source}: {text!r} is not a valid {self.kind.__name__}") from None

    def coerce(self, value: object, source: str, *, text: bool = False) -> object:
        """A file's value (``text``: a variable's string) as this setting's, type checked."""
        if self.many:
            if text and isinstance(value, str):
                value = _json_list(value, source) if value.startswith("[") else [value]
            if not isinstance(value, list):
                raise ConfigError(f"{source}: expected a list of {self.kind.__name__}")
            return tuple(self._one(v, source, text=text) for v in value)
        if text and self.optional and value == "":
            return None
        return self._one(value, source, text=text)

    def _one(self, value: object, source: str, *, text: bool) -> object:
        if text and isinstance(value, str):
            return self.parse(value, source)
        if self.kind is float and type(value) is int:
            return float(value)
        if self.kind is Path and isinstance(value, str):
            return Path(value)
        if type(value) is not self.kind:
            raise ConfigError(f"{source}: {value!r} is not a {self.kind.__name__}")
        return value


def _json_list(text: str, source: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(f"{source}: {text!r} is not a JSON array") from None


def _scalar(kind: type, text: str) -> object:
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)
    return kind(text)


def _setting(key: str, f: dataclasses.Field[object], hint: object) -> Setting:
    many = typing.get_origin(hint) is tuple
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(
        None
    ) in typing.get_args(hint)
    kind = args[0] if (many or optional) else hint
    if not isinstance(kind, type):
        raise TypeError(f"setting {key}: {hint!r} is not a type a source can parse")
    flag = f.metadata.get("flag", "")
    return Setting(
        key=key,
        kind=kind,
        many=many,
        optional=optional,
        default=f.default,
        help=f.metadata.get("help", ""),
        flag=None if flag is None else (flag or "--" + key.replace("_", "-")),
        metavar=f.metadata.get("metavar"),
        choices=f.metadata.get("choices", ()),
        switch_value=f.metadata.get("switch_value", True),
    )


def settings() -> dict[str, Setting]:
    """Every setting by key, in declaration order."""
    out: dict[str, Setting] = {}
    for key, (group, name) in KEYS.items():
        cls = GROUPS[group] if group else ServerConfig
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        out[key] = _setting(key, f, typing.get_type_hints(cls)[name])
    return out


def add_config_arguments(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The flag of every setting, and ``--config FILE``. ``defaults=False``: a flag not given
    is absent from the namespace (how ``flag_values`` tells given from default)."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None if defaults else argparse.SUPPRESS,
        metavar="FILE",
        help="a TOML file of settings; flags and $DREAMRT_* variables override it",
    )
    sections = {group: parser.add_argument_group(f"{group} settings") for group in GROUPS}
    for s in settings().values():
        if s.flag is None:
            continue
        shown = list(s.default) if isinstance(s.default, tuple) else s.default
        told = s.default not in (None, (), "") and s.kind is not bool
        default = shown if defaults else argparse.SUPPRESS
        help = f"{s.help} ({'default %(default)s, ' if told else ''}${s.env})"
        group = KEYS[s.key][0]
        target = sections[group] if group else parser
        if s.kind is bool:
            target.add_argument(
                s.flag, dest=s.dest, default=default, help=help, action="store_true"
            )
        else:
            target.add_argument(
                s.flag,
                dest=s.dest,
                default=default,
                help=help,
                type=s.kind,
                action="append" if s.many else "store",
                metavar=s.metavar or None,
                choices=s.choices or None,
            )


def flag_values(argv: Sequence[str]) -> tuple[dict[str, object], Path | None]:
    """The settings given as flags in ``argv`` (the arguments after ``serve``), and the
    ``--config`` file if given."""
    parser = argparse.ArgumentParser(add_help=False)
    add_config_arguments(parser, defaults=False)
    given = vars(parser.parse_known_args(list(argv))[0])
    config_file = given.pop("config", None)
    out: dict[str, object] = {}
    for s in settings().values():
        if s.flag is None or s.dest not in given:
            continue
        value = given[s.dest]
        if s.kind is bool:
            value = s.switch_value
        out[s.key] = tuple(value) if s.many else value
    return out, config_file


def env_values(environ: Mapping[str, str]) -> dict[str, object]:
    """The settings given as ``DREAMRT_<KEY>`` variables; a list is one value or a JSON
    array (``DREAMRT_ICE_HOSTS='["10.0.0.1", "10.0.0.2"]'``)."""
    out: dict[str, object] = {}
    for s in settings().values():
        if s.flag is None or s.env not in environ:
            continue
        out[s.key] = s.coerce(environ[s.env], f"${s.env}", text=True)
    return out


def file_values(path: Path) -> dict[str, object]:
    """The settings of a TOML file: each key at the top or in its group's table
    (``[engine] max_sessions = 2`` or ``max_sessions = 2``); an unknown key is an error."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    known = settings()
    out: dict[str, object] = {}

    def take(key: str, value: object, where: str) -> None:
        s = known.get(key)
        if s is None or s.flag is None:
            raise ConfigError(f"config file {path}: unknown setting {where}")
        out[key] = s.coerce(value, f"config file {path}: {where}")

    for key, value in data.items():
        if key in GROUPS and isinstance(value, dict):
            group = GROUPS[key]
            for inner, item in value.items():
                if KEYS.get(inner, ("", ""))[0] != key:
                    raise ConfigError(
                        f"config file {path}: [{key}] has no setting {inner!r} ({group.__name__})"
                    )
                take(inner, item, f"[{key}] {inner}")
        else:
            take(key, value, repr(key))
    return out


def load_config(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The config of ``dreamrt serve ARGV``: flags over ``DREAMRT_*`` over the file over the
    defaults. ``ConfigError`` (a ``ValueError``) names the setting and its source."""
    environ = os.environ if environ is None else environ
    flags, config_file = flag_values(argv)
    if config_file is None and environ.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(environ[ENV_PREFIX + "CONFIG"])
    merged = file_values(config_file) if config_file is not None else {}
    merged.update(env_values(environ))
    merged.update(flags)
    try:
        return ServerConfig.of(**merged)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a group's check (Limits raises ValueError)
        raise ConfigError(str(exc)) from None
