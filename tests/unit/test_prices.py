"""Token prices per model (domain/prices.py), their settings (config.py) and the cost line
of the receipt (domain/tracking.py)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from forgeflow.config import ConfigError, load_settings
from forgeflow.domain.prices import (
    Price,
    PriceError,
    Prices,
    Usage,
    cost,
    format_cost,
    parse_prices,
)
from forgeflow.domain.tracking import View, render

GPT = Price(Decimal("1.25"), Decimal("10"), Decimal("0.125"))


def test_cached_input_is_priced_instead_of_the_input_price() -> None:
    # 1,000,000 in of which 400,000 cached, 100,000 out:
    # 600,000 x 1.25 + 400,000 x 0.125 + 100,000 x 10 per million = 0.75 + 0.05 + 1.0
    assert cost(GPT, Usage(1_000_000, 100_000, 400_000)) == Decimal("1.8")
    # Without a cached price, cached input costs the input price.
    plain = Price(Decimal("1.25"), Decimal("10"))
    assert cost(plain, Usage(1_000_000, 100_000, 400_000)) == Decimal("2.25")


def test_the_arithmetic_is_decimal_and_bounded() -> None:
    # 0.1 + 0.2 in floats is 0.30000000000000004; in decimals it is what is shown.
    price = Price(Decimal("0.1"), Decimal("0.2"))
    assert cost(price, Usage(1_000_000, 1_000_000)) == Decimal("0.3")
    # A cached count above the input (never sent by codex) counts as the input;
    # negative counts count as none.
    assert cost(GPT, Usage(100, 0, 10_000)) == cost(GPT, Usage(100, 0, 100))
    assert cost(GPT, Usage(-5, -5, -5)) == 0
    # The largest counts a BIGINT holds at the largest price stay exact.
    huge = Price(Decimal(1_000_000), Decimal(1_000_000))
    assert cost(huge, Usage(2**62, 2**62)) == Decimal(2**63)


def test_a_cost_is_shown_to_four_places_never_as_a_false_zero() -> None:
    assert format_cost(Decimal("1.8"), "USD") == "1.8000 USD"
    assert format_cost(Decimal("0.00015"), "EUR") == "0.0002 EUR"  # half up
    assert format_cost(Decimal("0.00001"), "USD") == "< 0.0001 USD"
    assert format_cost(Decimal(0), "USD") == "0.0000 USD"  # a price of 0 is the operator's


def test_a_model_without_prices_has_no_cost_and_the_pair_prices_the_others() -> None:
    only = Prices({"gpt-5": GPT})
    assert only.shown("gpt-5", Usage(1_000_000, 100_000, 400_000)) == "1.8000 USD"
    assert only.cost("other", Usage(10, 10)) is None
    assert only.cost(None, Usage(10, 10)) is None
    fallback = Prices({"gpt-5": GPT}, Price(Decimal(1), Decimal(2)), "EUR")
    assert fallback.shown("other", Usage(1_000_000, 1_000_000)) == "3.0000 EUR"
    assert fallback.shown(None, Usage(1_000_000, 1_000_000)) == "3.0000 EUR"


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"gpt-5": {"input": 1}}, "gpt-5.output is missing"),
        ({"gpt-5": {"input": "x", "output": 1}}, "gpt-5.input must be a number"),
        ({"gpt-5": {"input": True, "output": 1}}, "gpt-5.input must be a number, not bool"),
        ({"gpt-5": {"input": -1, "output": 1}}, "gpt-5.input must be between 0"),
        ({"gpt-5": {"input": 1, "output": "nan"}}, "gpt-5.output must be between 0"),
        ({"gpt-5": {"input": 1, "output": 1, "cached_input": 2e7}}, "gpt-5.cached_input"),
        ({"gpt-5": {"input": 1, "output": 1, "cache": 1}}, "unknown key 'cache'"),
        ({"gpt-5": 3}, "gpt-5 must be a table"),
        ({"bad model": {"input": 1, "output": 1}}, "'bad model' is not a model name"),
    ],
)
def test_a_wrong_price_names_the_entry_and_the_key(table: dict[str, object], named: str) -> None:
    with pytest.raises(PriceError, match=named.replace("(", r"\(")):
        parse_prices(table)


def test_prices_come_from_the_toml_file_per_model(tmp_path: Path) -> None:
    cfg = tmp_path / "forgeflow.toml"
    cfg.write_text(
        '[forgeflow]\nprice_currency = "EUR"\n'
        '[forgeflow.prices]\n"gpt-5" = {input = 1.25, output = 10, cached_input = 0.125}\n'
    )
    table = load_settings(cfg).price_table()
    assert table.by_model == {"gpt-5": GPT} and table.default is None
    assert table.shown("gpt-5", Usage(1_000_000, 100_000, 400_000)) == "1.8000 EUR"


def test_a_wrong_price_setting_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORGEFLOW_PRICES", '{"gpt-5": {"input": 1, "output": "lots"}}')
    with pytest.raises(ConfigError, match=r"FORGEFLOW_PRICES: .*gpt-5\.output must be a number"):
        load_settings()
    monkeypatch.delenv("FORGEFLOW_PRICES")
    monkeypatch.setenv("FORGEFLOW_PRICE_CURRENCY", "dollars")
    with pytest.raises(ConfigError, match=r"FORGEFLOW_PRICE_CURRENCY: .*three-letter"):
        load_settings()


def test_the_receipt_shows_the_cost_only_when_there_is_one() -> None:
    base = View(header="giteabot: 已收到", input_tokens=12, output_tokens=3, outcome="done")
    assert "cost" not in render(base)
    priced = render(replace(base, cost="0.0012 USD"))
    assert "tokens: 12 in, 3 out · 费用 / cost: 0.0012 USD" in priced
