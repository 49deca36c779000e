"""The type of a JSON document whose shape its user defines (a run's state bag, a step's
input and output, a webhook's body): named for what it is, not typed as ``Any``.

Reading into one needs narrowing (``isinstance``), which is the point: nothing in such a
document is known until it is checked.
"""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"
