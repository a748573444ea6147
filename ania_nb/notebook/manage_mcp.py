"""``%ania mcp read SERVER URI``: show an MCP resource in the notebook, kept up to date.

Text is shown as it is (up to `SHOWN_CHARS`), images as images, binary content described.
When the server supports subscriptions the output subscribes to the resource: each
``notifications/resources/updated`` re-reads it and replaces the shown output in place. Reading
the same resource again moves the live view to the new output (one subscription per resource).
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from IPython.core.error import UsageError

from ..errors import ToolError
from .extension import NotebookState

SHOWN_CHARS = 100_000


def _bundles(result: Any) -> list[Any]:
    """What to display for a ``ReadResourceResult``: one text block, then each image."""
    from IPython.display import Image

    from ..mcp.results import convert_contents

    output = convert_contents(result.contents, SHOWN_CHARS)
    shown: list[Any] = [_Text(output.text or "(the resource is empty)")]
    for url in output.images:
        header, _, data = url.partition(",")
        kind = header.removeprefix("data:").split(";")[0].split("/")[-1]
        shown.append(Image(data=base64.b64decode(data), format=kind))
    return shown


class _Text:
    """Plain text for ``display`` (shown as it is, no repr quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)


async def read_resource(state: NotebookState, server: str, uri: str) -> None:
    """Display resource ``uri`` of ``server``; subscribe to its updates when the server can."""
    from IPython.display import display

    agent = await state.agent().start()
    registry = agent.mcp
    manager = registry.get(server) if registry is not None else None
    if manager is None:
        known = ", ".join(s.name for s in registry.servers()) if registry is not None else ""
        raise UsageError(f"no MCP server named {server!r}; servers: [{known}]")
    try:
        result = await manager.read_resource(uri)
    except ToolError as exc:  # the server's answer, not the user's fault: said, no traceback
        print(exc, file=sys.stderr)
        return
    handles = [display(item, display_id=True) for item in _bundles(result)]
    key = (server, uri)
    previous = state.resource_views.pop(key, None)
    if previous is not None:
        await previous()
    if not manager.features.subscribe:
        return

    async def refresh(updated: str) -> None:
        fresh = await manager.read_resource(updated)
        for handle, item in zip(handles, _bundles(fresh), strict=False):
            handle.update(item)

    try:
        stop: Callable[[], Awaitable[None]] = await manager.watch(uri, refresh)
    except ToolError as exc:
        print(f"shown once; not kept up to date: {exc}", file=sys.stderr)
        return
    state.resource_views[key] = stop
    print(f"(kept up to date: {server} sends updates of {uri})")
