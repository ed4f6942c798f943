"""The conformance suite's check of listing by prefixes: every store case that offers
``delimiter_listing`` is a ``DelimitedStore`` and lists the same objects by prefixes (split
from the first page on, two prefixes at a time) as its ``list()``."""

from __future__ import annotations

from typing import Any

import pytest

from concurrent_loader.listing import list_by_prefixes
from concurrent_loader.stores.base import DelimitedStore, ObjectInfo

from .conftest import OBJECTS, Case
from .test_conformance import with_store


def test_listing_by_prefixes_gives_what_listing_gives(case: Case) -> None:
    if not case.config.capabilities.delimiter_listing:
        pytest.skip("capabilities.delimiter_listing is False: listed as one sequence")

    async def use(store: Any) -> list[tuple[str, int]]:
        assert isinstance(store, DelimitedStore)
        found: list[ObjectInfo] = []
        await list_by_prefixes(store, 2, found.append, first_page=1)
        return sorted((info.key, info.size) for info in found)

    assert with_store(case, use) == sorted((key, len(data)) for key, data in OBJECTS.items())
