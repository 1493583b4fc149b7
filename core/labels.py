"""Job names and labels, and label selectors: validation, a parser and a matcher (pure).

Labels follow Kubernetes' syntax and selectors its grammar (Kubernetes documentation,
"Labels and Selectors"; ``k8s.io/apimachinery/pkg/labels``):

- a key is an optional prefix and a name, ``[prefix/]name``: the name at most 63 characters,
  alphanumeric at both ends with ``-``, ``_``, ``.`` between; the prefix a DNS subdomain
  (lowercase, dot-separated DNS labels) of at most 253 characters;
- a value is empty or at most 63 characters of the name's syntax;
- a job has at most :data:`MAX_LABELS` labels.

A selector is requirements separated by commas, all of which must hold (AND): ``key=value``
(or ``key==value``), ``key!=value`` (also true when the key is absent), ``key in (v1,v2)``,
``key notin (v1,v2)`` (also true when absent), ``key`` (the key is present), ``!key`` (absent).

Stores index a job's labels as *terms* (:func:`label_terms`): ``"key"`` for each key and
``"key=value"`` for each label (a key never holds ``=``, so the two never collide). Every
requirement is then "the job has one of these terms" or "none of them" (:meth:`Requirement.clause`),
which a store answers with an index: SQLite's ``job_labels`` table, MongoDB's multikey
``labelTerms`` array.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from core.errors import FieldError, InvalidRequest

MAX_LABELS = 64
"""The most labels a job may have."""
MAX_NAME_LENGTH = 63
"""The most characters of a label key's name part and of a label value (Kubernetes' limit)."""
MAX_PREFIX_LENGTH = 253
"""The most characters of a label key's prefix (a DNS subdomain, RFC 1123)."""
MAX_REQUIREMENTS = 32
"""The most requirements a selector may have (a bound on the query a store runs)."""
MAX_SET_VALUES = 64
"""The most values of one ``in`` / ``notin`` requirement."""
JOB_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$"
"""A job's ``name``: 1 to 253 characters, letters, digits, ``.``, ``_``, ``-``, alphanumeric at
both ends (Kubernetes' object names, with upper case and ``_`` allowed)."""

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_REQUIREMENT_TOKEN = r"[^\s,()=!]+"
_EXISTS = re.compile(rf"\s*(!?)\s*({_REQUIREMENT_TOKEN})\s*")
_EQUALITY = re.compile(rf"\s*({_REQUIREMENT_TOKEN})\s*(==|=|!=)\s*([^\s,()=!]*)\s*")
_SET = re.compile(rf"\s*({_REQUIREMENT_TOKEN})\s+(in|notin)\s*\(([^()]*)\)\s*")

Operator = Literal["=", "!=", "in", "notin", "exists", "!"]


def key_error(key: str) -> str | None:
    """Why ``key`` is not a label key, or None when it is."""
    prefix, slash, name = key.rpartition("/")
    if not name:
        return "a key needs a name (the part after any prefix/)"
    if len(name) > MAX_NAME_LENGTH:
        return f"the name part must be at most {MAX_NAME_LENGTH} characters"
    if not _NAME.fullmatch(name):
        return (
            "the name part must be letters, digits, '-', '_' or '.', starting and ending with "
            "a letter or digit"
        )
    if slash:
        if not prefix or len(prefix) > MAX_PREFIX_LENGTH:
            return f"the prefix must be 1 to {MAX_PREFIX_LENGTH} characters"
        if not all(_DNS_LABEL.fullmatch(part) for part in prefix.split(".")):
            return "the prefix must be a DNS subdomain (lower case, e.g. example.com)"
    return None


def value_error(value: str) -> str | None:
    """Why ``value`` is not a label value, or None when it is (the empty string is one)."""
    if len(value) > MAX_NAME_LENGTH:
        return f"a value must be at most {MAX_NAME_LENGTH} characters"
    if value and not _NAME.fullmatch(value):
        return (
            "a value must be empty or letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit"
        )
    return None


def label_errors(labels: Mapping[str, str], path: str = "labels") -> list[FieldError]:
    """Every problem of ``labels``, each naming its key (``labels.<key>``); [] when valid."""
    if len(labels) > MAX_LABELS:
        return [FieldError(path, f"at most {MAX_LABELS} labels (got {len(labels)})")]
    errors = []
    for key, value in labels.items():
        if (reason := key_error(key)) is not None:
            errors.append(FieldError(f"{path}.{key}", f"invalid key {key!r}: {reason}"))
        elif (reason := value_error(value)) is not None:
            errors.append(FieldError(f"{path}.{key}", f"invalid value {value!r}: {reason}"))
    return errors


def check_labels(labels: Mapping[str, str], path: str = "labels") -> None:
    """Raises: InvalidRequest: naming each offending key (:func:`label_errors`)."""
    errors = label_errors(labels, path)
    if errors:
        raise InvalidRequest(errors)


def merge_labels(labels: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """``labels`` after a JSON merge patch (RFC 7396) of them: a key with a string value is set,
    a key with null is removed, keys ``patch`` does not name are kept."""
    merged = dict(labels)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def label_terms(labels: Mapping[str, str]) -> list[str]:
    """The index terms of ``labels``, sorted: ``"key"`` and ``"key=value"`` for each label."""
    return sorted([*labels, *(f"{k}={v}" for k, v in labels.items())])


@dataclass(frozen=True, slots=True)
class TermClause:
    """One requirement as a store evaluates it: the job has at least one of ``terms``
    (``negated`` False) or none of them (True)."""

    negated: bool
    terms: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement of a selector.

    Attributes:
        key: the label key.
        operator: ``=`` (``==`` too), ``!=``, ``in``, ``notin``, ``exists`` (``key``) or ``!``
            (``!key``).
        values: the value (``=``, ``!=``) or the set (``in``, ``notin``); () for the others.
    """

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement (Kubernetes' semantics)."""
        present = self.key in labels
        match self.operator:
            case "=" | "in":
                return present and labels[self.key] in self.values
            case "!=" | "notin":
                return not present or labels[self.key] not in self.values
            case "exists":
                return present
            case "!":
                return not present

    def clause(self) -> TermClause:
        """This requirement over :func:`label_terms`: the same answer for every job."""
        if self.operator in ("exists", "!"):
            return TermClause(self.operator == "!", (self.key,))
        terms = tuple(f"{self.key}={v}" for v in self.values)
        return TermClause(self.operator in ("!=", "notin"), terms)

    def __str__(self) -> str:
        match self.operator:
            case "exists":
                return self.key
            case "!":
                return f"!{self.key}"
            case "in" | "notin":
                return f"{self.key} {self.operator} ({','.join(self.values)})"
            case _:
                return f"{self.key}{self.operator}{self.values[0]}"


@dataclass(frozen=True, slots=True)
class Selector:
    """Requirements that must all hold; the empty selector matches every job."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every requirement."""
        return all(r.matches(labels) for r in self.requirements)

    def clauses(self) -> list[TermClause]:
        """The requirements as :class:`TermClause` s, for a store's query."""
        return [r.clause() for r in self.requirements]

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def parse_selector(text: str, field: str = "labels") -> Selector:
    """Parse a label selector (``"team=billing,env!=dev,tier in (a,b),!legacy"``).

    Whitespace around tokens is ignored; an empty or blank ``text`` is the empty selector.

    Raises:
        InvalidRequest: on ``field``, saying which requirement is wrong and why.
    """
    parts = _split_requirements(text, field)
    if len(parts) > MAX_REQUIREMENTS:
        raise InvalidRequest(FieldError(field, f"at most {MAX_REQUIREMENTS} requirements"))
    return Selector(tuple(_requirement(p, field) for p in parts))


def _split_requirements(text: str, field: str) -> list[str]:
    """``text`` split at the commas outside parentheses."""
    if not text.strip():
        return []
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
            if depth > 1:
                raise InvalidRequest(FieldError(field, "parentheses cannot nest"))
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise InvalidRequest(FieldError(field, "')' without '('"))
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise InvalidRequest(FieldError(field, "'(' without ')'"))
    parts.append(text[start:])
    return parts


def _requirement(text: str, field: str) -> Requirement:
    def invalid(reason: str) -> InvalidRequest:
        return InvalidRequest(FieldError(field, f"requirement {text.strip()!r}: {reason}"))

    if not text.strip():
        raise invalid("empty (two commas in a row, or a trailing comma?)")
    requirement: Requirement
    if m := _SET.fullmatch(text):
        if not m[3].strip():
            raise invalid("a set needs at least one value")
        values = tuple(v.strip() for v in m[3].split(","))
        if len(values) > MAX_SET_VALUES:
            raise invalid(f"at most {MAX_SET_VALUES} values")
        operator: Operator = "in" if m[2] == "in" else "notin"
        requirement = Requirement(m[1], operator, values)
    elif m := _EQUALITY.fullmatch(text):
        requirement = Requirement(m[1], "!=" if m[2] == "!=" else "=", (m[3],))
    elif m := _EXISTS.fullmatch(text):
        requirement = Requirement(m[2], "!" if m[1] else "exists")
    else:
        raise invalid(
            "expected key, !key, key=value, key==value, key!=value, key in (v1,v2) or "
            "key notin (v1,v2)"
        )
    if (reason := key_error(requirement.key)) is not None:
        raise invalid(f"invalid key {requirement.key!r}: {reason}")
    for value in requirement.values:
        if (reason := value_error(value)) is not None:
            raise invalid(f"invalid value {value!r}: {reason}")
    return requirement
