"""The public surface: `__all__` matches the exports, and importing stays light."""

from __future__ import annotations

import subprocess
import sys
import types

import ania_nb

# The public surface, pinned: adding or removing a name here is an API decision ([arch §13]).
PUBLIC_API = [
    "AddResult",
    "Agent",
    "AniaError",
    "ApprovalRequest",
    "BaseTool",
    "Callbacks",
    "Clock",
    "ClockError",
    "ClockEvent",
    "ClockTask",
    "Config",
    "ConfigError",
    "Delivery",
    "Document",
    "FrontmatterError",
    "Hit",
    "HookResult",
    "HttpClients",
    "Knowledge",
    "KnowledgeError",
    "KnowledgeStatus",
    "LLMError",
    "LLMStreamError",
    "MCPServerError",
    "MemoryEntry",
    "Message",
    "MissingExtraError",
    "Outbox",
    "Quota",
    "ResourceError",
    "RunError",
    "RunEvent",
    "RunRecord",
    "RunResult",
    "Session",
    "SessionBusyError",
    "SkillError",
    "SkillInstallError",
    "StoreError",
    "TaskLogEntry",
    "Tool",
    "ToolCallRecord",
    "ToolCallResult",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolSignal",
    "Usage",
    "UsageError",
    "UsageReport",
    "__version__",
    "tool",
]
# Public module attributes that are not API: IPython's extension hooks.
NOT_EXPORTED = {"load_ipython_extension", "unload_ipython_extension"}


def _public_attributes(module: types.ModuleType) -> set[str]:
    """The module's public names, submodules (``ania_nb.agent`` …) left out."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def test_the_public_api_is_pinned():
    assert ania_nb.__all__ == PUBLIC_API  # sorted, and nothing added or lost by accident
    assert all(hasattr(ania_nb, name) for name in PUBLIC_API)
    # a name imported into the package but not exported is an accident too
    stray = _public_attributes(ania_nb) - set(PUBLIC_API) - NOT_EXPORTED
    assert stray == set(), "export these in __all__ (and pin them here) or import them privately"


def test_the_pin_catches_an_accidental_export(monkeypatch):
    # Guard the guard: a public name that appears in the package is reported.
    monkeypatch.setattr(ania_nb, "SessionTable", object, raising=False)
    assert "SessionTable" in _public_attributes(ania_nb) - set(PUBLIC_API) - NOT_EXPORTED


def test_every_export_is_documented_and_the_version_comes_from_the_metadata():
    from importlib import metadata

    for name in PUBLIC_API:
        value = getattr(ania_nb, name)
        if isinstance(value, type):
            assert vars(value).get("__doc__"), f"{name} needs a docstring of its own"
        elif callable(value):
            assert getattr(value, "__doc__", None), f"{name} needs a docstring"
    assert ania_nb.__version__ == metadata.version("ania-nb")


def test_the_types_users_touch_through_an_agent_are_the_exported_ones():
    import typing

    from ania_nb import agent as agent_module

    hints = typing.get_type_hints(ania_nb.Agent.runs)
    assert hints["return"] == list[ania_nb.RunRecord]
    assert typing.get_type_hints(ania_nb.Agent.history)["return"] == list[ania_nb.Message]
    assert typing.get_type_hints(ania_nb.Agent.session)["return"] is ania_nb.Session
    assert ania_nb.Clock.__module__ == "ania_nb.clock"
    assert ania_nb.ClockTask.__module__ == "ania_nb.clock.model"
    assert agent_module.Outbox is ania_nb.Outbox and agent_module.Quota is ania_nb.Quota


def test_agent_shows_only_what_users_call():
    plumbing = {
        "inject",
        "run_one_shot",
        "add_derived_usage",
        "on_stop",
        "open_store",
        "quota_denial",
        "system_prompt_for",
        "is_admin",
        "role_of",
    }
    public = {n for n in dir(ania_nb.Agent) if not n.startswith("_")}
    assert public & plumbing == set()  # behind agent.host
    host = ania_nb.orchestration.AgentHost
    assert plumbing <= {n for n in dir(host) if not n.startswith("_")}


def test_import_does_not_load_heavy_dependencies():
    code = (
        "import sys, ania_nb, ania_nb.testing; "
        "heavy = [m for m in ('openai', 'mcp', 'lancedb', 'httpx2', 'apscheduler') "
        "if m in sys.modules]; "
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
    "ania_nb.testing.onebot.ActionError": "the OneBot test implementation's own failed action",
    "ania_nb.testing.onebot.HandshakeRejected": "the test implementation's refused handshake",
    "ania_nb.governance.hook_output._UnreadableOutput": "private; reported as a hook error",
    "ania_nb.store.journal._QuickCloseFailed": "private; the step is redone the careful way",
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
