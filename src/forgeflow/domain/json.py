"""The shape of a JSON document, for values that are JSON by nature (audit metadata, an
event's payload, a control's stored answer): precise enough that mypy makes a reader
narrow what it takes out, instead of an ``Any`` that lets anything through."""

from __future__ import annotations

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject = dict[str, JsonValue]
