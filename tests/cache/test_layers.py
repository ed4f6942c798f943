"""The cache is a store wrapper: it imports the stores' contract, never the layers above."""

from __future__ import annotations

import ast
from pathlib import Path

import concurrent_loader.cache


def _imported(path: Path) -> set[str]:
    """The package-relative modules ``path`` imports from outside ``cache/`` (any depth)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 2:
            found.add(node.module or "")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").removeprefix("concurrent_loader."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("concurrent_loader.") for a in node.names)
    return found


def test_the_cache_imports_nothing_from_the_layers_above():
    for path in Path(concurrent_loader.cache.__file__).parent.glob("*.py"):
        above = {m for m in _imported(path) if m.split(".")[0] in ("fetch", "pipeline", "loader")}
        assert not above, f"cache/{path.name} imports {above}"
