"""Run inputs checked against a template's declared inputs. Pure.

Errors name the input (``inputs.pr: required``). The command line passes every value
as text, so ``coerce_text`` parses ``"42"`` for an integer input, JSON for objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from forgeflow.domain.json import JsonObject
from forgeflow.pipelines.definition import InputSpec


class InputError(Exception):
    code = "invalid_inputs"

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _from_text(spec: InputSpec, text: str) -> Any:
    if spec.type == "string":
        return text
    if spec.type == "boolean":
        low = text.strip().lower()
        if low in _TRUE | _FALSE:
            return low in _TRUE
        raise ValueError("expected a boolean (true/false)")
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"expected {spec.type}") from None


def _check(spec: InputSpec, value: Any) -> Any:
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }[spec.type]
    if not ok and spec.type == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if not ok:
        raise ValueError(f"expected {spec.type}, got {type(value).__name__}")
    return value


def validate_inputs(
    declared: list[InputSpec], values: Mapping[str, Any], *, coerce_text: bool = False
) -> JsonObject:
    """The inputs of a run with defaults filled in, or :class:`InputError`."""
    errors: list[str] = []
    out: JsonObject = {}
    specs = {s.name: s for s in declared}
    for name in values:
        if name not in specs:
            errors.append(f"inputs.{name}: not a declared input")
    for spec in declared:
        if spec.name not in values or values[spec.name] is None:
            if spec.default is not None:
                out[spec.name] = spec.default
            elif spec.required:
                errors.append(f"inputs.{spec.name}: required")
            continue
        value = values[spec.name]
        try:
            if coerce_text and isinstance(value, str):
                value = _from_text(spec, value)
            out[spec.name] = _check(spec, value)
        except ValueError as exc:
            errors.append(f"inputs.{spec.name}: {exc}")
    if errors:
        raise InputError(errors)
    return out
