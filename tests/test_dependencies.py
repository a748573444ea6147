"""Every third-party package the code imports is declared in pyproject.toml, in the right list.

The package may import only its core dependencies, except `ania_nb.notebook`, which may also use
the ``notebook`` extra, and `ania_nb.store`, which may also use the ``postgres`` extra (psycopg,
imported lazily when ``store.url`` names a PostgreSQL server); tests, notebooks and benchmarks may
use the test and dev extras too (the test extra includes both).
Imports are read from the source (function-level and ``TYPE_CHECKING`` ones included, and
``importlib.import_module("name")``), so a lazy import of an undeclared package is caught as well.

The lower bounds are tested by installing exactly them into a throwaway venv::

    python tests/test_dependencies.py --pins > /tmp/pins.txt
    python -m venv /tmp/lowvenv && /tmp/lowvenv/bin/pip install -r /tmp/pins.txt
    PYTHONPATH=. /tmp/lowvenv/bin/python -m pytest -o addopts="" tests/test_llm.py ...
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import sys
import tomllib
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

# Imported inside ``try/except ImportError`` on purpose, never required.
OPTIONAL = {
    "markdown": "the widgets' Markdown fallback when mistune is missing",
    "psutil": "the run-owner check where /proc is missing (not Linux)",
}

# Which dependency lists each part of the tree may use.
CORE = ("core",)
NOTEBOOK = ("core", "notebook")
STORE = ("core", "postgres")
TESTS = ("core", "notebook", "postgres", "test")
EVERYTHING = ("core", "notebook", "postgres", "test", "dev")

# Test-only packages whose lower bounds `--pins` includes (the rest of the test extra is tooling).
PINNED_TEST_PACKAGES = ("pytest", "pytest-asyncio", "mcp-server-time", "nbclient", "nbformat")


@cache
def requirements() -> dict[str, list[Requirement]]:
    """The requirements of pyproject.toml: ``core`` and one list per extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lists = {"core": project["dependencies"], **project["optional-dependencies"]}
    return {group: [Requirement(r) for r in reqs] for group, reqs in lists.items()}


def declared(groups: tuple[str, ...]) -> set[str]:
    """Canonical names of the distributions declared in ``groups`` (ania-nb itself left out)."""
    names = {canonicalize_name(r.name) for g in groups for r in requirements()[g]}
    return names - {"ania-nb"}


def imported_modules(source: str, filename: str) -> set[str]:
    """Top-level names of the absolute imports in ``source`` (lazy ones included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            found.add(node.args[0].value)
    return {name.split(".")[0] for name in found}


def notebook_sources(path: Path) -> str:
    """The Python in a notebook's code cells: cell magics (a prompt, not code) and line magics
    and shell lines dropped."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = [
        line
        for cell in cells
        if cell["cell_type"] == "code" and not "".join(cell["source"]).startswith("%%")
        for line in "".join(cell["source"]).splitlines()
        if not line.lstrip().startswith(("%", "!"))
    ]
    return "\n".join(lines)


def sources(folder: str) -> dict[Path, str]:
    """Every ``.py`` file (and notebook) under ``folder``, by path."""
    base = ROOT / folder
    found = {p: p.read_text(encoding="utf-8") for p in sorted(base.rglob("*.py"))}
    found.update({p: notebook_sources(p) for p in sorted(base.rglob("*.ipynb"))})
    return found


def third_party(module: str, local: set[str]) -> bool:
    """Whether ``module`` comes from an installed distribution (not stdlib, ours or local)."""
    return module not in sys.stdlib_module_names and module not in local | {"__future__"}


def undeclared(
    folder: str, groups_for: dict[str, tuple[str, ...]], also_local: tuple[str, ...] = ()
) -> list[str]:
    """One line per import under ``folder`` of a package its dependency lists do not declare.

    ``groups_for`` maps a sub-folder prefix (relative to the root) to the lists it may use; the
    longest matching prefix wins. Modules of the ``also_local`` folders count as local too.
    """
    dists = md.packages_distributions()
    local = {"ania_nb"}
    for name in (folder, *also_local):
        base = ROOT / name
        local |= {p.stem for p in base.rglob("*.py")} | {p.name for p in base.iterdir()}
    problems: list[str] = []
    for path, text in sources(folder).items():
        rel = path.relative_to(ROOT).as_posix()
        prefix = max((p for p in groups_for if rel.startswith(p)), key=len)
        allowed = declared(groups_for[prefix])
        for module in sorted(imported_modules(text, rel)):
            if not third_party(module, local) or module in OPTIONAL:
                continue
            providers = {canonicalize_name(d) for d in dists.get(module, [])}
            if not providers:
                problems.append(f"{rel}: imports {module!r}, which no installed package provides")
            elif not providers & allowed:
                problems.append(
                    f"{rel}: imports {module!r} from {sorted(providers)}, not declared in "
                    f"{' + '.join(groups_for[prefix])}"
                )
    return problems


def test_the_package_imports_only_declared_dependencies():
    problems = undeclared(
        "ania_nb", {"ania_nb/": CORE, "ania_nb/notebook/": NOTEBOOK, "ania_nb/store/": STORE}
    )
    assert problems == [], "\n".join(problems)


def test_tests_notebooks_and_benchmarks_import_only_declared_dependencies():
    problems = (
        undeclared("tests", {"tests/": TESTS})
        + undeclared("notebooks", {"notebooks/": TESTS})
        # bench/replicas.py drives the replicas with the tests' OneBot impl and PG cluster
        + undeclared("bench", {"bench/": EVERYTHING}, also_local=("tests",))
    )
    assert problems == [], "\n".join(problems)


def test_every_core_dependency_is_imported_by_the_package():
    dists = md.packages_distributions()
    used: set[str] = set()
    for path, text in sources("ania_nb").items():
        for module in imported_modules(text, str(path)):
            used.update(canonicalize_name(d) for d in dists.get(module, []))
    assert declared(CORE) - used == set(), "core dependencies nothing imports"


def test_installed_versions_satisfy_the_declared_bounds():
    wrong = []
    for group in EVERYTHING:
        for req in requirements()[group]:
            if canonicalize_name(req.name) == "ania-nb":
                continue
            version = md.version(req.name)
            if not req.specifier.contains(version, prereleases=True):
                wrong.append(f"{req.name} {version} does not satisfy {req} ({group})")
            if not any(s.operator == ">=" for s in req.specifier):
                wrong.append(f"{req} ({group}) has no lower bound")
    assert wrong == [], "\n".join(wrong)


def test_the_missing_extra_check_names_modules_of_that_extra():
    from ania_nb._extras import EXTRAS

    dists = md.packages_distributions()
    for extra, modules in EXTRAS.items():
        for module in modules:
            providers = {canonicalize_name(d) for d in dists.get(module, [])}
            assert providers & declared((extra,)), f"{module} is not provided by the {extra} extra"


def test_psycopg_is_allowed_in_the_store_only_and_the_test_extra_installs_it():
    dists = md.packages_distributions()
    for module in ("psycopg", "psycopg_pool"):
        providers = {canonicalize_name(d) for d in dists.get(module, [])}
        assert providers & declared(STORE), f"{module} is not declared in the postgres extra"
        assert not providers & declared(CORE), f"{module} must stay out of the core list"
    extras = {
        extra
        for r in requirements()["test"]
        if canonicalize_name(r.name) == "ania-nb"
        for extra in r.extras
    }
    assert {"notebook", "postgres"} <= extras  # `.[dev]` brings the PostgreSQL half of the tests


def test_the_scanner_sees_lazy_and_type_checking_imports():
    source = (
        "import os, yaml.constructor\n"
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    import httpx2\n"
        "def f():\n    from mcp.client import sse\n    importlib.import_module('openai.types')\n"
    )
    assert imported_modules(source, "x.py") == {"os", "yaml", "typing", "httpx2", "mcp", "openai"}


def lower_bound_pins() -> list[str]:
    """``name==lower`` for the core and notebook lists and the test packages the suite needs."""
    wanted = [*requirements()["core"], *requirements()["notebook"]] + [
        r for r in requirements()["test"] if canonicalize_name(r.name) in PINNED_TEST_PACKAGES
    ]
    pins = []
    for req in wanted:
        lower = next(s.version for s in req.specifier if s.operator == ">=")
        pins.append(f"{req.name}=={lower}")
    return pins


if __name__ == "__main__":
    if sys.argv[1:] != ["--pins"]:
        sys.exit("usage: python tests/test_dependencies.py --pins")
    print("\n".join(lower_bound_pins()))
