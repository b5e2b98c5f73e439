"""What every fuzz test shares: the search settings and the count of cases it ran."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests import figures

SECTION = "hostile input"


def search(examples: int) -> settings:
    """Reproducible (derandomized) and without deadlines (the machine may be busy)."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


class Cases:
    """Counts the cases a hypothesis test actually ran and records the figure."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self.tried = 0

    def __call__(self) -> None:
        self.tried += 1

    def record(self) -> None:
        assert self.tried > 0
        figures.record(SECTION, f"{self.parser} fuzz cases", self.tried)


def said(error: Exception) -> None:
    """A refusal the user can act on: it says something."""
    assert str(error).strip(), f"{type(error).__name__} without a message"


#: Any JSON value (what a user can put in an annotation or a cloud in a document).
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)

#: Strings that look like times, and some that only nearly do.
times = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda t: t.isoformat()),
    st.datetimes().map(lambda t: t.isoformat() + "Z"),
    st.sampled_from(
        [
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59-01:00",
            "2026-11-30T10:02:00Z",
            "2026-11-30T10:02:00",
            "",
            "now",
        ]
    ),
    st.text(max_size=30),
)


def mutate(doc: Any) -> st.SearchStrategy[Any]:
    """``doc`` with one of its values (at any depth) replaced by any JSON value, or removed."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, (*path, i))

    walk(doc, ())

    def apply(path: tuple[Any, ...], replacement: Any, remove: bool) -> Any:
        copy = json.loads(json.dumps(doc))
        if not path:
            return replacement
        parent = copy
        for step in path[:-1]:
            parent = parent[step]
        if remove:
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
        return copy

    return st.builds(apply, st.sampled_from(paths), json_values | times, st.booleans())
