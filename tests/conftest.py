"""Tiers: tests/unit (pure, fast, no server) and tests/integration (real Redis, real worker processes)."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-count",
        type=int,
        default=None,
        help="requests of the chaos soak test (tests/chaos/test_soak.py; or FUSEFLEET_SOAK_COUNT)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
