"""core/labels: label syntax, the selector parser, the matcher and its term clauses."""

from __future__ import annotations

import itertools

import pytest

from core.errors import InvalidRequest
from core.labels import (
    MAX_LABELS,
    Requirement,
    Selector,
    check_labels,
    label_errors,
    label_terms,
    merge_labels,
    parse_selector,
)


@pytest.mark.parametrize(
    "key",
    ["team", "app.kubernetes.io/name", "a", "A_b-c.d", "x" * 63, "example.com/" + "y" * 63],
)
def test_valid_keys(key: str) -> None:
    assert label_errors({key: "v"}) == []


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("", "needs a name"),
        ("x" * 64, "at most 63"),
        ("-team", "starting and ending"),
        ("team-", "starting and ending"),
        ("te am", "letters, digits"),
        ("Example.com/team", "DNS subdomain"),
        ("/team", "prefix must be 1 to 253"),
        ("a/b/c", "DNS subdomain"),
        ("team=x", "letters, digits"),
        ("p" * 254 + "/team", "prefix must be 1 to 253"),
    ],
)
def test_invalid_keys_are_named(key: str, reason: str) -> None:
    [error] = label_errors({key: "v"})
    assert error.field == f"labels.{key}"
    assert reason in error.reason


@pytest.mark.parametrize(("value", "ok"), [("", True), ("v" * 63, True), ("v" * 64, False),
                                           ("a b", False), ("-a", False), ("a.b_c-d", True)])  # fmt: skip
def test_values(value: str, ok: bool) -> None:
    assert (label_errors({"k": value}) == []) is ok


def test_at_most_64_labels() -> None:
    assert label_errors({f"k{i}": "v" for i in range(MAX_LABELS)}) == []
    [error] = label_errors({f"k{i}": "v" for i in range(MAX_LABELS + 1)})
    assert error.field == "labels"
    with pytest.raises(InvalidRequest, match="at most 64"):
        check_labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})


def test_merge_labels_is_a_json_merge_patch() -> None:
    assert merge_labels({"a": "1", "b": "2"}, {"b": None, "c": "3", "zz": None}) == {
        "a": "1",
        "c": "3",
    }


def test_terms() -> None:
    assert label_terms({"team": "billing", "tier": ""}) == [
        "team",
        "team=billing",
        "tier",
        "tier=",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team=billing", [Requirement("team", "=", ("billing",))]),
        ("team==billing", [Requirement("team", "=", ("billing",))]),
        (" team = billing ", [Requirement("team", "=", ("billing",))]),
        ("env!=dev", [Requirement("env", "!=", ("dev",))]),
        ("tier=", [Requirement("tier", "=", ("",))]),
        ("tier in (a, b)", [Requirement("tier", "in", ("a", "b"))]),
        ("tier notin (a,b)", [Requirement("tier", "notin", ("a", "b"))]),
        ("legacy", [Requirement("legacy", "exists")]),
        ("! legacy", [Requirement("legacy", "!")]),
        (
            "team=billing,env!=dev,tier in (a,b),!legacy,example.com/x",
            [
                Requirement("team", "=", ("billing",)),
                Requirement("env", "!=", ("dev",)),
                Requirement("tier", "in", ("a", "b")),
                Requirement("legacy", "!"),
                Requirement("example.com/x", "exists"),
            ],
        ),
        ("", []),
        ("   ", []),
    ],
)
def test_parse(text: str, expected: list[Requirement]) -> None:
    assert parse_selector(text).requirements == tuple(expected)


def test_canonical_text_parses_back() -> None:
    s = parse_selector("team==billing, env != dev,tier in (a, b),!legacy,x")
    assert str(s) == "team=billing,env!=dev,tier in (a,b),!legacy,x"
    assert parse_selector(str(s)) == s


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("team=billing,", "empty"),
        (",team", "empty"),
        ("team in (a", "'(' without ')'"),
        ("team in a)", "')' without '('"),
        ("team in ((a))", "cannot nest"),
        ("team in ()", "at least one value"),
        ("team=a=b", "expected key"),
        ("team billing", "expected key"),
        ("te$m=x", "invalid key"),
        ("team=bad value", "expected key"),
        ("team=-x", "invalid value"),
        ("team in (ok, -bad)", "invalid value"),
        ("team>3", "invalid key"),
        (",".join(f"k{i}" for i in range(33)), "at most 32"),
    ],
)
def test_invalid_selectors_name_the_field(text: str, reason: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_selector(text, field="labels")
    [error] = e.value.errors
    assert error.field == "labels"
    assert reason in error.reason


LABEL_SETS = [
    {},
    {"team": "billing"},
    {"team": "search"},
    {"team": "billing", "env": "dev"},
    {"team": "billing", "env": "prod", "legacy": ""},
    {"env": "dev"},
]
SELECTORS = {
    "team=billing": [1, 3, 4],
    "team!=billing": [0, 2, 5],
    "team in (billing,search)": [1, 2, 3, 4],
    "team notin (billing)": [0, 2, 5],
    "env": [3, 4, 5],
    "!env": [0, 1, 2],
    "team=billing,env!=dev": [1, 4],
    "legacy=": [4],
    "team=billing,!legacy,env": [3],
    "": [0, 1, 2, 3, 4, 5],
}


@pytest.mark.parametrize(("text", "indexes"), SELECTORS.items())
def test_matches(text: str, indexes: list[int]) -> None:
    selector = parse_selector(text)
    assert [i for i, labels in enumerate(LABEL_SETS) if selector.matches(labels)] == indexes


@pytest.mark.parametrize("text", SELECTORS)
def test_clauses_over_terms_agree_with_the_matcher(text: str) -> None:
    """What a store computes from the terms is what the matcher says, for every label set."""
    selector = parse_selector(text)
    values = ["billing", "search", "dev", "prod", ""]
    keys = ["team", "env", "legacy"]
    label_sets = [
        {k: v for k, v in zip(keys, combo, strict=True) if v is not None}
        for combo in itertools.product([None, *values], repeat=len(keys))
    ]
    for labels in label_sets:
        terms = set(label_terms(labels))
        by_terms = all(bool(terms & set(c.terms)) != c.negated for c in selector.clauses())
        assert by_terms == selector.matches(labels), (text, labels)


def test_empty_selector_is_falsy_and_matches_all() -> None:
    assert not Selector()
    assert Selector().matches({"a": "b"})


def test_a_set_has_at_most_64_values() -> None:
    parse_selector(f"k in ({','.join(str(i) for i in range(64))})")
    with pytest.raises(InvalidRequest, match="at most 64 values"):
        parse_selector(f"k in ({','.join(str(i) for i in range(65))})")
