"""The import rule: every module of ``concurrent_loader`` imports only from its own floor or
the floors below it, and no modules import each other in a circle.

Imports are read with ``ast`` from the source (no module is imported), every one of them:
those inside functions and those under ``if TYPE_CHECKING:`` too, since each is an arrow of
the design whether or not it runs at import time. :data:`FLOORS` is the one table of the
floors; a module of a package not in it fails the test until it is placed. Violations that
exist today are in :data:`ALLOWED`, each named and explained: the list may only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import concurrent_loader

PACKAGE = "concurrent_loader"
ROOT = Path(concurrent_loader.__file__).parent

#: Floors, lowest first: a module may import from its own floor and those below. The names
#: are the package's top-level modules and packages ("" is ``concurrent_loader`` itself).
FLOORS: list[tuple[str, frozenset[str]]] = [
    # errors, keys and process plumbing: no imports from the package but among themselves
    ("base", frozenset({"errors", "keys", "loops", "forkgate", "finish", "closing"})),
    # settings, the per-process runtime (event loop, thread pools) and counters
    ("settings", frozenset({"config", "runtime", "metrics"})),
    # HTTP/1.1, nothing about S3
    ("transport", frozenset({"transport"})),
    # where bytes live: the Store contract, backends, and wrappers that are stores
    ("stores", frozenset({"stores"})),
    # listing a store, and the node cache (a store wrapper that never imports fetch)
    ("cache", frozenset({"listing", "cache"})),
    # policies around a store: retries, limits, hedges, parts
    ("fetch", frozenset({"fetch"})),
    # what a sample is made of (index -> reads) and bytes -> samples
    ("sources", frozenset({"sources", "decode"})),
    # one process's batches, in order
    ("pipeline", frozenset({"pipeline"})),
    # torch's DataLoader, the device side, and shard-order sampling
    ("loader", frozenset({"loader", "gpu", "streaming"})),
    # the datasets users make: ObjectDataset/ImageFolder and the tar-shard feature
    ("datasets", frozenset({"dataset", "shards"})),
    # entry points: the package's exports, the command line, test servers
    ("entry", frozenset({"", "cli", "__main__", "testing", "analyze"})),
]

#: Violations of today's code, each an ("importer", "imported") pair of module names
#: relative to the package, which the test lets pass. Fix one and delete its line: the
#: list only shrinks (``test_the_allowed_list_names_only_violations_that_exist`` says when
#: an entry has gone stale).
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by name relative to it ("" for the package)."""
    return {_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports_of(name: str, path: Path) -> Iterator[str]:
    """The package's modules ``name`` imports (a name imported from a package is its
    submodule when there is one, else the package)."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    yield alias.name.removeprefix(PACKAGE).lstrip(".")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
                target = (node.module or "").removeprefix(PACKAGE).lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                yield sub if sub in known else target


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the other modules of the package it imports."""
    return {
        name: frozenset(m for m in _imports_of(name, path) if m != name)
        for name, path in modules().items()
    }


def floor_of(name: str) -> int:
    top = name.split(".")[0]
    for level, (_, members) in enumerate(FLOORS):
        if top in members:
            return level
    raise LookupError(name)


def upward_imports() -> set[tuple[str, str]]:
    return {
        (importer, imported)
        for importer, targets in graph().items()
        for imported in targets
        if floor_of(imported) > floor_of(importer)
    }


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def circle_edges() -> set[tuple[str, str]]:
    edges = graph()
    return {
        (a, b) for component in circles() for a in component for b in edges[a] if b in component
    }


def test_every_module_is_on_a_floor() -> None:
    unplaced = []
    for name in modules():
        try:
            floor_of(name)
        except LookupError:
            unplaced.append(name)
    assert not unplaced, f"add these to FLOORS in {__file__}: {unplaced}"


def test_the_floors_name_each_top_level_module_once() -> None:
    names = [name for _, members in FLOORS for name in members]
    assert len(names) == len(set(names))
    tops = {name.split(".")[0] for name in modules()}
    assert not set(names) - tops, f"FLOORS names modules that do not exist: {set(names) - tops}"


def test_no_import_goes_up_a_floor() -> None:
    bad = sorted(upward_imports() - ALLOWED)
    lines = [
        f"{a} (floor {FLOORS[floor_of(a)][0]}) imports {b} ({FLOORS[floor_of(b)][0]})"
        for a, b in bad
    ]
    assert not bad, "imports from a lower floor to a higher one:\n" + "\n".join(lines)


def test_no_modules_import_each_other_in_a_circle() -> None:
    bad = sorted(circle_edges() - ALLOWED)
    assert not bad, "import circles (each arrow in one):\n" + "\n".join(
        f"{a} -> {b}" for a, b in bad
    )


def test_the_allowed_list_names_only_violations_that_exist() -> None:
    stale = sorted(ALLOWED - upward_imports() - circle_edges())
    if stale:
        # Not a failure while the fixes land in the tree; the reason names what to delete.
        pytest.skip(f"fixed, delete from ALLOWED in tests/test_layers.py: {stale}")


def test_the_reader_sees_real_imports() -> None:
    """The walk itself: a known arrow of each kind is found."""
    edges = graph()
    assert "errors" in edges["config"]  # from ..errors import ...
    assert "stores.base" in edges["stores.local"]  # from .base import ...
    assert "stores.s3" in edges["stores.registry"]  # from .s3 import (a package)
    assert "loader" in edges[""]  # from .loader import ... in the package itself
