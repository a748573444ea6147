"""The run view as static HTML, for a saved notebook whose kernel (and widget models) are gone.

JupyterLab, nbviewer, GitHub and ``nbconvert --to html`` show it.
It is built from the same parts as the live widget (tool rows, approval cards, nested children,
the reply rendered as Markdown), so the final state looks the same with or without a kernel.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from ...text import flatten
from ._format import elapsed_text
from ._icons import color_of, icon

if TYPE_CHECKING:  # pragma: no cover
    from .run import RunView

FRAME = "border:1px solid #ddd;padding:4px;font-family:var(--jp-ui-font-family,sans-serif)"


def header_html(view: RunView, *, spinner: bool = False) -> str:
    """Icon, status (or outcome), session; elapsed time and usage are separate in the widget."""
    state, label = view.headline()
    shown = icon(state, label=label) if not spinner else ""
    return (
        f'{shown} <b class="ania-status" style="color:{color_of(state)}">{html.escape(label)}</b>'
        f" <small>{html.escape(view.session)}</small>"
    )


def run_html(view: RunView) -> str:
    """The whole run (header, prompt, body, reply, error) as one self-contained HTML block."""
    usage = view.usage_label.value
    parts = [
        '<div class="ania-run-header" style="display:flex;flex-wrap:wrap;gap:12px;'
        'align-items:center;margin:0 6px">'
        f"<span>{header_html(view)}</span><span>{elapsed_text(view.elapsed)}</span>"
        f"<span>{html.escape(usage)}</span></div>"
    ]
    if view.prompt:
        parts.append(f"<div><small>› {html.escape(flatten(view.prompt, 200))}</small></div>")
    parts += [item_html(item) for item in view.items]
    parts.append(f'<div class="ania-reply">{view.reply.value}</div>')
    parts.append(view.error_html.value)
    return f'<div class="ania-run" style="{FRAME}">' + "".join(parts) + "</div>"


def item_html(item: Any) -> str:
    """One body entry: its own ``html()`` when it has one, else its widget's value."""
    render = getattr(item, "html", None)
    if callable(render):
        return str(render())
    return str(getattr(item.widget, "value", ""))
