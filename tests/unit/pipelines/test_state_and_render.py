"""The state bag's reducers and the sandboxed template renderer."""

from __future__ import annotations

from typing import Any

import pytest

from forgeflow.pipelines import state as bag
from forgeflow.pipelines.render import RenderError, TemplateRenderer
from forgeflow.pipelines.state import MISSING, ReducerError, StateReducer
from forgeflow.redaction import register_secrets

R = StateReducer


@pytest.mark.parametrize(
    ("reducer", "existing", "incoming", "expected"),
    [
        (R.OVERRIDE, 1, 2, 2),
        (R.OVERRIDE, MISSING, [1], [1]),
        (R.APPEND, MISSING, "a", ["a"]),
        (R.APPEND, MISSING, ["a"], ["a"]),
        (R.APPEND, ["a"], "b", ["a", "b"]),
        (R.APPEND, ["a"], ["b", "c"], ["a", "b", "c"]),
        (R.APPEND, "a", "b", ["a", "b"]),
        (R.MERGE_LISTS, [1], [2, 3], [1, 2, 3]),
        (R.MERGE_LISTS, MISSING, 1, 1),
        (R.MERGE_LISTS, 1, 2, [1, 2]),
        (R.MERGE_MAPS, {"a": 1, "b": 1}, {"b": 2}, {"a": 1, "b": 2}),
        (R.MERGE_MAPS, MISSING, {"a": 1}, {"a": 1}),
        (R.SUM, 1, 2, 3),
        (R.SUM, MISSING, 2.5, 2.5),
        (R.SUM, None, 4, 4),
    ],
)
def test_reducers(reducer: StateReducer, existing: Any, incoming: Any, expected: Any) -> None:
    assert bag.reduce(reducer, existing, incoming) == expected


@pytest.mark.parametrize(
    ("reducer", "existing", "incoming"),
    [
        (R.MERGE_MAPS, {"a": 1}, [1]),
        (R.MERGE_MAPS, MISSING, "x"),
        (R.SUM, 1, "2"),
        (R.SUM, True, 1),
        (R.SUM, MISSING, "x"),
    ],
)
def test_reducers_refuse_mismatched_values(
    reducer: StateReducer, existing: Any, incoming: Any
) -> None:
    with pytest.raises(ReducerError):
        bag.reduce(reducer, existing, incoming)


def test_write_does_not_alias_and_errors_are_recorded() -> None:
    value = {"nested": [1]}
    state = bag.write({}, "k", value, R.OVERRIDE)
    value["nested"].append(2)
    assert state == {"k": {"nested": [1]}}
    state = bag.record_error(bag.record_error(state, "a", "boom"), "b", "bang")
    assert state["_stepErrors"] == {"a": "boom", "b": "bang"}
    assert bag.lookup({"a": {"b": [10, {"c": 3}]}}, "a.b.1.c") == 3
    assert bag.lookup({"a": [1]}, "a.5") is MISSING
    assert bag.lookup({"a": 1}, "a.b") is MISSING


CONTEXT = {"event": {"number": 5, "title": "Fix it", "labels": ["bug"]}, "n": None}


def test_rendering_text_and_native_values() -> None:
    r = TemplateRenderer()
    assert r.render("PR #{{event.number}}: {{ event.title }}", CONTEXT) == "PR #5: Fix it"
    assert r.render("{{ event.number }}", CONTEXT) == 5
    assert r.render({"x": ["{{event.labels}}", "plain"]}, CONTEXT) == {"x": [["bug"], "plain"]}
    assert r.render("{{ event['title'] | upper }}", CONTEXT) == "FIX IT"
    assert r.render("{{ event.labels.0 }}", CONTEXT) == "bug"
    assert r.render("{{ missing | default('none') }}", CONTEXT) == "none"
    assert r.render("{% for l in event.labels %}[{{ l }}]{% endfor %}", CONTEXT) == "[bug]"
    assert r.render(7, CONTEXT) == 7


@pytest.mark.parametrize(
    "template",
    ["{{ missing }}", "x {{ event.nope }} y", "{{ event.number.digits }}", "{{ a.b.c }}"],
)
def test_an_unresolved_placeholder_is_an_error(template: str) -> None:
    with pytest.raises(RenderError) as caught:
        TemplateRenderer().render(template, CONTEXT)
    assert caught.value.code == "unresolved_placeholder"


def test_unresolved_placeholders_may_be_allowed() -> None:
    r = TemplateRenderer(allow_unresolved=True)
    assert r.render("a{{ missing }}b{{ x.y.z }}", CONTEXT) == "ab"
    assert r.render("{{ missing.deeper }}", CONTEXT) == ""


@pytest.mark.parametrize(
    "template",
    [
        "{{ event.__class__ }}",
        "{{ ''.__class__.__mro__ }}",
        "{{ event.items() }}",
        "{{ event.title.upper() }}",
        "{{ cycler }}",
        "{{ range(3) }}",
        "{{ event.__init__.__globals__ }}",
        "{{ (event|attr('__class__')) }}",
        "{{ self }}",
    ],
)
def test_no_way_to_python_internals(template: str) -> None:
    with pytest.raises(RenderError):
        TemplateRenderer().render(template, CONTEXT)


def test_secrets_are_masked_in_what_is_rendered() -> None:
    register_secrets(["s3cr3t-token-value"])
    context = {"cfg": {"note": "use s3cr3t-token-value here", "apiKey": "abc"}}
    r = TemplateRenderer()
    assert r.render("{{ cfg.note }}", context) == "use *** here"
    assert r.render("{{ cfg }}", context) == {"note": "use *** here", "apiKey": "***"}
    assert r.render_text("{{ cfg.note }}!", context) == "use *** here!"
