"""TemplateRenderer: ``{{…}}`` placeholders in step inputs, filled from the state bag.

Jinja2's :class:`SandboxedEnvironment` with three more locks:

- an unresolved placeholder is an error (``StrictUndefined``) unless the node sets
  ``extras.allowUnresolvedPlaceholders`` (then it renders empty);
- ``a.b`` only looks up keys and list indices — never a Python attribute — and no
  object can be called, so ``{{ x.__class__ }}`` or ``{{ d.items() }}`` go nowhere;
- registered secrets are masked in everything rendered (``forgeflow.redaction``).

A string that is exactly one placeholder (``"{{ event.number }}"``) keeps the value's
type (the integer 5, not the text "5"). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import ChainableUndefined, StrictUndefined, TemplateError, Undefined
from jinja2.sandbox import SandboxedEnvironment

from forgeflow.redaction import redact, redact_text

_SINGLE = re.compile(r"^\s*\{\{\s*([^{}]+?)\s*\}\}\s*$")


class RenderError(Exception):
    """A template could not be rendered; ``code`` says whether a value was missing."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _KeysOnly(SandboxedEnvironment):
    """Attribute syntax reads mapping keys and list indices, nothing else."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self.getitem(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, Undefined):
            if isinstance(obj, ChainableUndefined):
                return obj
            obj._fail_with_undefined_error()
        if isinstance(obj, Mapping):
            if argument in obj:
                return obj[argument]
        elif isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
            index = argument
            if isinstance(argument, str) and argument.lstrip("-").isdigit():
                index = int(argument)
            if isinstance(index, int) and not isinstance(index, bool):
                try:
                    return obj[index]
                except IndexError:
                    pass
        elif isinstance(obj, str) and isinstance(argument, int | slice):
            return obj[argument]
        return self.undefined(obj=obj, name=str(argument))

    def is_safe_callable(self, obj: Any) -> bool:
        return False

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        return False


def _env(undefined: type[Undefined]) -> _KeysOnly:
    env = _KeysOnly(undefined=undefined, autoescape=False, keep_trailing_newline=True)
    env.globals.clear()  # no range(), dict(), lipsum(), cycler() …
    return env


_STRICT = _env(StrictUndefined)
_LENIENT = _env(ChainableUndefined)


class TemplateRenderer:
    """Renders values (strings, lists and mappings of them) against a context."""

    def __init__(self, *, allow_unresolved: bool = False) -> None:
        self._env = _LENIENT if allow_unresolved else _STRICT

    def render(self, value: Any, context: Mapping[str, Any]) -> Any:
        """``value`` with every string template rendered; secrets masked."""
        return redact(self._render(value, context))

    def render_text(self, text: str, context: Mapping[str, Any]) -> str:
        """Render as text whatever the placeholders hold."""
        try:
            return redact_text(self._env.from_string(text).render(dict(context)))
        except TemplateError as exc:
            raise _error(exc) from None

    def _render(self, value: Any, context: Mapping[str, Any]) -> Any:
        if isinstance(value, str):
            return self._string(value, context)
        if isinstance(value, Mapping):
            return {str(k): self._render(v, context) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._render(v, context) for v in value]
        return value

    def _string(self, text: str, context: Mapping[str, Any]) -> Any:
        if "{{" not in text and "{%" not in text:
            return text
        single = _SINGLE.match(text)
        try:
            if single:
                expr = self._env.compile_expression(single.group(1), undefined_to_none=False)
                result = expr(**dict(context))
                if isinstance(result, Undefined):
                    if isinstance(result, StrictUndefined):
                        str(result)  # raises UndefinedError with Jinja's message
                    return ""
                return _plain(result)
            return self._env.from_string(text).render(dict(context))
        except TemplateError as exc:
            raise _error(exc) from None


def _plain(value: Any) -> Any:
    """Copy a looked-up value (so the result never aliases the state bag); only JSON
    values come out of a template, never a Python object."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise RenderError("template_error", f"a template gave a {type(value).__name__}, not data")


def _error(exc: TemplateError) -> RenderError:
    from jinja2 import UndefinedError
    from jinja2.exceptions import SecurityError

    if isinstance(exc, UndefinedError):
        return RenderError("unresolved_placeholder", f"unresolved placeholder: {exc.message}")
    if isinstance(exc, SecurityError):
        return RenderError("template_error", f"not allowed in a template: {exc.message}")
    return RenderError("template_error", f"template error: {exc.message or exc}")
