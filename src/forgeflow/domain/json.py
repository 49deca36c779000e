"""The type of a JSON document whose shape its user defines (a run's state bag, a step's
input and output, a webhook's body): named for what it is, not typed as ``Any``.

Reading into one needs narrowing (``isinstance``), which is the point: nothing in such a
document is known until it is checked. At run time ``JsonValue`` is a named alias (PEP
695's, from typing_extensions on Python 3.11) so pydantic models can use it too; mypy
reads the same union as a recursive alias (as pydantic's own ``JsonValue`` does).
"""

from typing import TYPE_CHECKING, TypeAlias, Union

from typing_extensions import TypeAliasType

if TYPE_CHECKING:
    JsonValue: TypeAlias = (
        "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
    )
    JsonObject: TypeAlias = "dict[str, JsonValue]"
else:
    JsonValue = TypeAliasType(
        "JsonValue",
        Union[str, int, float, bool, list["JsonValue"], dict[str, "JsonValue"], None],  # noqa: UP007
    )
    JsonObject = dict[str, JsonValue]
