"""The layers and the private-module rule ([arch §1]): every module of the package is scanned.

Each top-level part of ``ania_nb`` (a subpackage or a top-level module) may import only the parts
`MAY_IMPORT` lists, itself and the shared leaves; the front ends sit on the façade, the façade on
the orchestration packages, and so down to the store. A ``_private`` module may be imported only
from inside the package that contains it: ``store/_x.py`` by ``store`` and its subpackages, a
top-level leaf ``ania_nb/_x.py`` by any module of ``ania_nb`` (never by users: they import the
names ``ania_nb`` exports). Type-only imports count too: they are dependencies a reader follows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ania_nb

PACKAGE = Path(ania_nb.__file__).parent

# Leaf modules every part may import: each imports only other leaves (and `_env` the type of
# the security settings it reads).
LEAVES = {"errors", "_atomic", "_env", "_extras", "_http", "_preview", "_subprocess", "_version"}
LEAVES |= {"_storage_cause"}  # whether a failure is the disk's: store, knowledge, runner
LEAVES |= {"session_keys", "text", "addresses"}  # one helper per idea: keys, cutting, hosts
LEAVES |= {"catalogue"}  # the texts people read, in each front end's language

MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "_atomic": set(),
    "_env": {"config"},
    "_extras": set(),
    "_http": set(),
    "_preview": set(),
    "_subprocess": set(),
    "_version": set(),
    "_storage_cause": set(),
    "session_keys": set(),
    "text": set(),
    "addresses": set(),
    "catalogue": set(),
    "prompts": set(),
    "store": set(),
    "config": set(),
    "testing": set(),  # standard library only: tests, demos and notebooks import it as is
    "engine": {"config", "store"},
    "result": {"engine"},
    "tools": {"engine", "config", "store"},
    "mcp": {"tools", "engine", "config", "store"},
    "skills": {"tools", "engine", "config", "store"},
    "governance": {"tools", "engine", "config", "store", "result"},
    "knowledge": {"tools", "engine", "config", "store", "result"},
    "quota": {"engine", "config", "store"},
    "orchestration": {
        "governance",
        "tools",
        "mcp",
        "skills",
        "engine",
        "config",
        "store",
        "result",
        "prompts",
    },
}
# Orchestration-level packages built on the one run path: agents (subagents, teams) and the
# clock, whose runs may start subagents.
MAY_IMPORT["agents"] = MAY_IMPORT["orchestration"] | {"orchestration"}
MAY_IMPORT["clock"] = MAY_IMPORT["agents"] | {"agents"}
# The façade wires everything below the front ends (knowledge and quota through callables).
MAY_IMPORT["agent"] = MAY_IMPORT["clock"] | {"clock", "knowledge", "quota"}
# Front ends talk to the engine through the façade and the callbacks bridge.
MAY_IMPORT["notebook"] = MAY_IMPORT["agent"] | {"agent"}
MAY_IMPORT["runner"] = MAY_IMPORT["agent"] | {"agent"}
MAY_IMPORT["demo"] = MAY_IMPORT["agent"] | {"agent", "testing"}
MAY_IMPORT["cli"] = MAY_IMPORT["demo"] | {"demo", "runner"}
# The package exports the façade's surface and loads the notebook extension on request.
MAY_IMPORT["__init__"] = MAY_IMPORT["agent"] | {"agent", "notebook"}
MAY_IMPORT["__main__"] = {"cli"}

FRONT_ENDS = {"notebook", "runner", "agent", "cli", "demo", "__init__", "__main__"}


def _module_name(relative: Path) -> str:
    """``store/db.py`` → ``ania_nb.store.db``; a package's ``__init__.py`` is the package."""
    parts = ["ania_nb", *relative.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    """Whether ``ania_nb.a.b`` is a module or package of the tree."""
    where = PACKAGE.joinpath(*dotted.split(".")[1:])
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """The ``ania_nb`` modules ``source`` (the text of ``module``) imports, as dotted names.

    ``from M import name`` counts as importing ``M.name`` when that is a module, else ``M``;
    relative imports are resolved against ``module``'s package; nested and ``TYPE_CHECKING``
    imports count.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    continue  # above the package: not ours
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                found.add(candidate if _is_module(candidate) else origin)
    return {m for m in found if m == "ania_nb" or m.startswith("ania_nb.")}


def part_of(module: str) -> str:
    """The top-level part a module belongs to (``ania_nb`` itself is ``__init__``)."""
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def private_import_problem(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported`` (a private module outside its package)."""
    bits = imported.split(".")
    for depth, bit in enumerate(bits):
        if bit.startswith("_") and not bit.startswith("__"):
            owner = ".".join(bits[:depth])
            if importer != owner and not importer.startswith(owner + "."):
                return f"{imported} is private to {owner}"
    return None


def _scan() -> dict[str, set[str]]:
    """Every module of the package with the ``ania_nb`` modules it imports."""
    scanned: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        module = _module_name(relative)
        source = path.read_text(encoding="utf-8")
        scanned[module] = imported_modules(source, module, is_package=path.name == "__init__.py")
    return scanned


SCANNED = _scan()


def test_every_part_of_the_package_has_a_row_in_the_table():
    parts = {part_of(module) for module in SCANNED}
    assert parts == set(MAY_IMPORT), "give a new part of the package its row in MAY_IMPORT"


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_each_part_imports_only_what_its_layer_may(part):
    allowed = MAY_IMPORT[part] | LEAVES | {part}
    offenders = {
        module: sorted(bad)
        for module, imports in SCANNED.items()
        if part_of(module) == part and (bad := {part_of(i) for i in imports} - allowed)
    }
    assert offenders == {}, f"{part} imports a layer it may not: {offenders}"


def test_nothing_below_the_front_ends_imports_them():
    below = {part for part in MAY_IMPORT if part not in FRONT_ENDS}
    for part in below:
        assert not (MAY_IMPORT[part] & FRONT_ENDS), part
        assert "testing" not in MAY_IMPORT[part]  # the scripted model is for tests and demos


def test_no_private_module_is_imported_from_outside_its_package():
    offenders = {
        module: problems
        for module, imports in SCANNED.items()
        if (problems := sorted(p for i in imports if (p := private_import_problem(module, i))))
    }
    assert offenders == {}, f"make what is shared public: {offenders}"


# ------------------------------------------------------------------ guard the guard


def test_the_scanner_resolves_relative_absolute_nested_and_package_imports():
    source = (
        "from ..orchestration import RunSpec\n"
        "import ania_nb.notebook\n"
        "from ania_nb import __version__\n"
        "from ..store import db\n"
        "def later():\n"
        "    from ._llm_wire import Completion\n"
    )
    found = imported_modules(source, "ania_nb.engine.probe")
    assert found == {
        "ania_nb.orchestration",
        "ania_nb.notebook",
        "ania_nb",
        "ania_nb.store.db",
        "ania_nb.engine._llm_wire",
    }
    assert {part_of(m) for m in found} == {
        "orchestration",
        "notebook",
        "__init__",
        "store",
        "engine",
    }
    package = imported_modules("from .db import Database\n", "ania_nb.store", is_package=True)
    assert package == {"ania_nb.store.db"}


def test_the_private_rule_allows_a_package_its_own_and_refuses_the_others():
    assert private_import_problem("ania_nb.engine.llm", "ania_nb.engine._llm_wire") is None
    assert private_import_problem("ania_nb.tools.builtin.bash", "ania_nb.tools._process") is None
    assert private_import_problem("ania_nb.store", "ania_nb.store._x") is None
    assert private_import_problem("ania_nb.mcp.transport", "ania_nb._env") is None  # a leaf
    assert private_import_problem("ania_nb.clock.store", "ania_nb.store._db") == (
        "ania_nb.store._db is private to ania_nb.store"
    )
    assert private_import_problem("ania_nb.notebook.manage_kb", "ania_nb.notebook.widgets._x")
    assert private_import_problem("ania_nb.engine.llm", "ania_nb.tools.builtin._paths")
