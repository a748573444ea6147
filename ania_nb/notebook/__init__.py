"""The notebook face: ``%load_ext ania_nb`` registers ``%%agent``, ``%agent`` and ``%ania``.

Loading is cheap: the Agent (and openai, mcp, ipywidgets) are created on the first run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .magics import AgentMagics, transform_cell

__all__ = ["AgentMagics", "load_ipython_extension", "transform_cell", "unload_ipython_extension"]

log = logging.getLogger(__name__)

_closing: set[asyncio.Task[None]] = set()
"""Agents still closing after ``%unload_ext`` on a running loop (the kernel's): the loop keeps
only weak references to tasks, and nothing else is left holding the unloaded magics."""


def load_ipython_extension(shell: Any) -> None:
    """Register the magics and the cell rewriter (idempotent)."""
    from .._extras import require_extra

    require_extra("notebook", "%load_ext ania_nb")
    if "AgentMagics" in shell.magics_manager.registry:
        return
    shell.register_magics(AgentMagics(shell))
    if transform_cell not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(transform_cell)


def unload_ipython_extension(shell: Any) -> None:
    """Remove the cell rewriter and close the Agent; the magics go away with the registry entry."""
    if transform_cell in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(transform_cell)
    magics = shell.magics_manager.registry.pop("AgentMagics", None)
    if magics is None:
        return
    for table in shell.magics_manager.magics.values():
        for name in [n for n, fn in table.items() if getattr(fn, "__self__", None) is magics]:
            del table[name]
    if magics.state.agent_created:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            magics.state.run_sync(magics.state.close_agent())
            return
        task = loop.create_task(magics.state.close_agent(), name="ania_nb: close the Agent")
        _closing.add(task)
        task.add_done_callback(_closed)


def _closed(task: asyncio.Task[None]) -> None:
    _closing.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("closing the Agent after %unload_ext failed", exc_info=error)
