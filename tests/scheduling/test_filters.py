"""`header-based-testing-filter`: which endpoints each header value keeps."""

from __future__ import annotations

import pytest

from . import builders

E = builders.endpoint
POOL = [
    E("a", address="10.0.0.1", port=8000),
    E("a-rank-1", address="10.0.0.1", port=8001),
    E("b", address="10.0.0.2", port=8000),
    E("c", address="fd00::3", port=8000),
]


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        (None, ["a", "a-rank-1", "b", "c"]),  # absent: everything passes
        ("10.0.0.2", ["b"]),
        ("10.0.0.1", ["a", "a-rank-1"]),  # a bare address keeps every port at it
        ("10.0.0.1:8001", ["a-rank-1"]),  # address:port keeps exactly that endpoint
        ("10.0.0.2, 10.0.0.1:8000", ["a", "b"]),  # input order kept, whitespace ignored
        ("10.0.0.2,10.0.0.2,,", ["b"]),
        ("fd00::3", ["c"]),
        ("[fd00::3]", ["c"]),
        ("[fd00::3]:8000", ["c"]),
        ("[fd00::3]:9999", []),
        ("10.0.0.2:9999", []),
        ("192.168.9.9", []),
        ("", []),  # present but naming nothing: nothing passes
    ],
)
def test_header_based_testing_filter(header: str | None, kept: list[str]) -> None:
    headers = {} if header is None else {"test-epp-endpoint-selection": header}
    out = builders.plugin("header-based-testing-filter").filter({}, builders.request(headers=headers), POOL)
    assert [ep.name for ep in out] == kept
