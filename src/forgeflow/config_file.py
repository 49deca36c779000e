"""The optional TOML file of settings (``--config``): how it is read, strictly, and the
settings source it becomes behind the environment. ``config.py`` keeps the settings."""

from __future__ import annotations

import tomllib
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

# A TOML document as tomllib reads it: JSON's values, and dates and times.
TomlValue = (
    str | int | float | bool | datetime | date | time | list["TomlValue"] | dict[str, "TomlValue"]
)
TomlTable = dict[str, TomlValue]


class ConfigError(Exception):
    """A setting that stops start-up; ``str()`` is one line naming the variable."""


class TomlSource(PydanticBaseSettingsSource):
    """The file's settings as pydantic-settings asks a source for them."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data: TomlTable = {}
        if path is not None:
            self._data = read_toml(path, set(settings_cls.model_fields))

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    # The values pydantic-settings validates into the settings' fields.
    def __call__(self) -> TomlTable:
        return {k: v for k, v in self._data.items() if k in self.settings_cls.model_fields}


def read_toml(path: Path, known: set[str]) -> TomlTable:
    """The settings of a TOML file (a ``[forgeflow]`` table or the top level), keyed by
    field name; :class:`ConfigError` naming the file and the key for anything else: a
    typo that were ignored would leave the setting at its default without a word."""
    if path.is_dir():
        raise ConfigError(f"--config: {path} is a folder, not a TOML file")
    if not path.exists():
        raise ConfigError(f"--config: file {path} does not exist")
    try:
        with path.open("rb") as fh:
            raw: TomlTable = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path} ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config: {path} is not valid TOML ({exc})") from None
    prefix, table = "", raw
    inner = raw.get("forgeflow")
    if isinstance(inner, dict):
        beside = [k for k in raw if k != "forgeflow"]
        if beside:
            raise ConfigError(f"--config: {path}: unknown key {beside[0]!r} beside [forgeflow]")
        prefix, table = "[forgeflow] ", inner
    data: TomlTable = {}
    for key, value in table.items():
        name = str(key).lower().removeprefix("forgeflow_")
        if name not in known:
            raise ConfigError(f"--config: {path}: unknown key {prefix}{key!r}")
        data[name] = value
    return data
