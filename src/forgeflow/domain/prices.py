"""Token prices per model and what a task cost (pure; no I/O).

The operator may configure, per model, a price per million input tokens, per million
output tokens and (optionally) per million cached input tokens; the pair
``FORGEFLOW_PRICE_INPUT_PER_MTOK`` / ``FORGEFLOW_PRICE_OUTPUT_PER_MTOK`` prices every
model without its own entry. Codex reports cached input tokens as a part of the input
tokens (``cachedInputTokens`` ≤ ``inputTokens`` in ``thread/tokenUsage/updated``), so
they are priced instead of, not besides, the plain input price. Without a price for
the model there is no cost at all (None), never a "0". Arithmetic is decimal: a cost
is shown to four places and a float's binary error would show in them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

MAX_PRICE = Decimal(1_000_000)  # per million tokens: far above any model's
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/\-]{0,99}")  # as domain/options.py
_CURRENCY_RE = re.compile(r"[A-Z]{3}")  # an ISO 4217 code
_KEYS = ("input", "output", "cached_input")
_SHOWN = Decimal("0.0001")
MILLION = Decimal(1_000_000)


class PriceError(ValueError):
    """A price setting that is wrong; ``str()`` names the entry and the key."""


@dataclass(frozen=True, slots=True)
class Price:
    """One model's prices per million tokens; cached input None: the input price."""

    input_per_mtok: Decimal
    output_per_mtok: Decimal
    cached_input_per_mtok: Decimal | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """A task's tokens as recorded: ``cached_input`` is a part of ``input``."""

    input: int
    output: int
    cached_input: int = 0


@dataclass(frozen=True, slots=True)
class Prices:
    by_model: Mapping[str, Price] = field(default_factory=dict)
    default: Price | None = None  # models without an entry of their own
    currency: str = "USD"

    def of(self, model: str | None) -> Price | None:
        found = self.by_model.get(model) if model else None
        return found if found is not None else self.default

    def cost(self, model: str | None, usage: Usage) -> Decimal | None:
        """What ``usage`` cost with ``model``'s prices; None when it has none."""
        price = self.of(model)
        return None if price is None else cost(price, usage)

    def shown(self, model: str | None, usage: Usage) -> str | None:
        """The cost as the receipt and the task page show it, or None."""
        amount = self.cost(model, usage)
        return None if amount is None else format_cost(amount, self.currency)


def cost(price: Price, usage: Usage) -> Decimal:
    """The exact cost of ``usage`` (negative counts count as none; cached input is at
    most the input, as Codex reports it)."""
    total_in = max(usage.input, 0)
    cached = min(max(usage.cached_input, 0), total_in)
    cached_price = price.input_per_mtok
    if price.cached_input_per_mtok is not None:
        cached_price = price.cached_input_per_mtok
    amount = (
        (total_in - cached) * price.input_per_mtok
        + cached * cached_price
        + max(usage.output, 0) * price.output_per_mtok
    )
    return amount / MILLION


def format_cost(amount: Decimal, currency: str) -> str:
    """``0.0123 USD``; an amount above zero that rounds to nothing is ``< 0.0001 USD``
    (a cost shown as 0 would say the work was free)."""
    rounded = amount.quantize(_SHOWN, rounding=ROUND_HALF_UP)
    if amount > 0 and rounded == 0:
        return f"< {_SHOWN} {currency}"
    return f"{rounded} {currency}"


def _amount(value: object, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise PriceError(f"{where} must be a number, not {type(value).__name__}")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise PriceError(f"{where} must be a number, not {str(value)[:40]!r}") from None
    if not amount.is_finite() or not 0 <= amount <= MAX_PRICE:
        raise PriceError(f"{where} must be between 0 and {MAX_PRICE} per million tokens")
    return amount


def parse_price(raw: object, where: str) -> Price:
    """``{"input": 1.25, "output": 10, "cached_input": 0.125}`` (the last optional)."""
    if not isinstance(raw, Mapping):
        raise PriceError(f"{where} must be a table of input, output and cached_input")
    unknown = [str(k) for k in raw if k not in _KEYS]
    if unknown:
        raise PriceError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    for key in ("input", "output"):
        if key not in raw:
            raise PriceError(f"{where}.{key} is missing")
    cached = raw.get("cached_input")
    return Price(
        _amount(raw["input"], f"{where}.input"),
        _amount(raw["output"], f"{where}.output"),
        None if cached is None else _amount(cached, f"{where}.cached_input"),
    )


def parse_prices(raw: Mapping[str, object]) -> dict[str, Price]:
    """The per-model table; :class:`PriceError` naming the first wrong entry."""
    out: dict[str, Price] = {}
    for model, entry in raw.items():
        if not isinstance(model, str) or _MODEL_RE.fullmatch(model) is None:
            raise PriceError(f"{str(model)[:60]!r} is not a model name")
        out[model] = parse_price(entry, model)
    return out


def check_currency(value: str) -> str:
    if _CURRENCY_RE.fullmatch(value) is None:
        raise PriceError(f"{value[:20]!r} is not a three-letter currency code such as USD")
    return value
