"""The public surface: `__all__` matches the exports, and importing stays light."""

from __future__ import annotations

import subprocess
import sys

import ania_nb


def test_all_is_sorted_and_matches_the_public_names():
    public = sorted(
        n for n in vars(ania_nb) if (not n.startswith("_") and n[0].isupper()) or n == "tool"
    )
    exported = [n for n in ania_nb.__all__]
    assert exported == sorted(exported)
    assert set(public) <= set(exported) | {"annotations"}
    assert all(hasattr(ania_nb, name) for name in exported)


def test_import_does_not_load_heavy_dependencies():
    code = (
        "import sys, ania_nb, ania_nb.testing; "
        "heavy = [m for m in ('openai', 'mcp', 'lancedb', 'httpx2') if m in sys.modules]; "
        "print(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- the error tree

# Exceptions that may stay outside `AniaError`, with the reason. Keep it short and true.
OUTSIDE_THE_TREE = {
    "ania_nb.engine.llm._HandlerFailed": "private wrapper; the caller's own exception is re-raised",
    "ania_nb.engine._llm_wire.Malformed": "private module; LLMClient reports it as an LLMError",
    "ania_nb.engine._llm_wire.ProviderError": "private module; LLMClient reports it as an LLMError",
    "ania_nb.tools.schema._Unsupported": "private; tool_schema raises a ToolDefinitionError",
    "ania_nb.governance.hook_output._UnreadableOutput": "private; reported as a hook error",
}


def _package_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in an ania_nb module, by qualified name."""
    import importlib
    import pkgutil

    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(ania_nb.__path__, "ania_nb."):
        if info.name == "ania_nb.__main__":  # runs the CLI when imported
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_the_package_defines_is_an_ania_error():
    found = _package_exceptions()
    outside = {name for name, cls in found.items() if not issubclass(cls, ania_nb.AniaError)}
    assert outside == set(OUTSIDE_THE_TREE), "derive new exceptions from a family in errors.py"
    assert {"ania_nb.errors.MCPServerError", "ania_nb.errors.FrontmatterError"} <= set(found)


def _drawn_tree() -> dict[str, str | None]:
    """The tree in ania_nb.errors' docstring as {class name: drawn parent}."""
    import re

    doc = ania_nb.errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column, name) of the open branches
    for line in doc.splitlines():
        match = re.match(r"^(\s*(?:[│├└─ ]*── )?)([A-Z]\w+)\b", line)
        if match is None or (not match.group(1).strip() and match.group(2) != "AniaError"):
            continue
        column, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    return parents


def test_the_drawn_error_tree_matches_the_classes():
    drawn = _drawn_tree()
    public = {
        cls.__name__: cls
        for cls in _package_exceptions().values()
        if issubclass(cls, ania_nb.AniaError) and not cls.__name__.startswith("_")
    }
    assert set(drawn) == set(public), "draw every public exception in the errors.py docstring"
    for name, parent in drawn.items():
        if parent is not None:
            assert public[parent] in public[name].__bases__, f"{name} is drawn under {parent}"


def test_every_error_class_is_exported_and_tool_denied_is_gone():
    errors = {
        name
        for name, obj in vars(ania_nb.errors).items()
        if isinstance(obj, type) and issubclass(obj, ania_nb.AniaError)
    }
    assert errors <= set(ania_nb.__all__)
    assert "ToolDenied" not in errors  # nothing raised it; blocked calls are gate outcomes
    from ania_nb.governance import HookResult
    from ania_nb.mcp import MCPServerError
    from ania_nb.skills import FrontmatterError, SkillInstallError

    assert ania_nb.HookResult is HookResult
    assert issubclass(MCPServerError, ania_nb.ResourceError)
    assert issubclass(SkillInstallError, ania_nb.SkillError)
    assert issubclass(FrontmatterError, ValueError)  # kept for callers that caught ValueError
    assert not issubclass(ania_nb.StoreError, ania_nb.RunError)  # raised outside runs too
    assert issubclass(ania_nb.MissingExtraError, ImportError)
