"""Fixtures of the integration tests: an Engine over the test's own database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cyclone_server.store.engine import Engine


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[Engine]:
    """An Engine over this test's fresh database, closed after the test."""
    e = await Engine.open(db_url, min_size=1, max_size=12)
    try:
        yield e
    finally:
        await e.close()
