"""Status icons as inline SVG, for the widget and the static HTML alike.

They render without an emoji or symbol font (stock Chromium, nbconvert HTML, nbviewer).
Plain-text renderings keep Unicode glyphs (`_format.STATUS_ICONS`), chosen from DejaVu Sans.
"""

from __future__ import annotations

import html

# 16x16 shapes, drawn with ``currentColor`` so the icon takes the colour around it.
_STROKE = 'fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round"'
_THIN = _STROKE.replace('stroke-width="2"', 'stroke-width="1.5"')
_SHAPES = {
    "check": f'<path d="M2.5 8.5l3.5 3.5 7.5-8" {_STROKE}/>',
    "cross": f'<path d="M3.5 3.5l9 9M12.5 3.5l-9 9" {_STROKE}/>',
    "ban": f'<circle cx="8" cy="8" r="6" {_STROKE}/><path d="M3.8 12.2l8.4-8.4" {_STROKE}/>',
    "clock": f'<circle cx="8" cy="8" r="6" {_STROKE}/><path d="M8 4.5V8l2.5 1.5" {_STROKE}/>',
    "stop": '<rect x="3" y="3" width="10" height="10" rx="1" fill="currentColor"/>',
    "running": f'<circle cx="8" cy="8" r="6" {_STROKE}/>'
    '<path d="M8 2a6 6 0 0 1 0 12z" fill="currentColor"/>',
    "pending": f'<circle cx="8" cy="8" r="6" {_STROKE}/>',
    "warning": '<path d="M8 1.5L15 14H1z" fill="currentColor"/>'
    '<path d="M8 6v4M8 11.8v.2" stroke="#fff" stroke-width="1.8" stroke-linecap="round"/>',
    "hourglass": f'<path d="M4 2h8M4 14h8M5 2c0 4 6 4 6 6s-6 2-6 6M11 2c0 4-6 4-6 6s6 2 6 6" '
    f"{_THIN}/>",
    "download": f'<path d="M8 2v8M4.5 7L8 10.5 11.5 7M3 13.5h10" {_STROKE}/>',
    "book": f'<path d="M2 3h4.5A1.5 1.5 0 0 1 8 4.5V14a1.5 1.5 0 0 0-1.5-1.5H2zM14 3H9.5A1.5 '
    f'1.5 0 0 0 8 4.5V14a1.5 1.5 0 0 1 1.5-1.5H14z" {_THIN}/>',
    "memory": f'<circle cx="8" cy="7" r="5" {_THIN}/><path d="M6 14h4M8 4v3l2 1" {_THIN}/>',
}

GREEN, RED, AMBER, GREY, BLUE = "#2e7d32", "#c62828", "#ef6c00", "#757575", "#1565c0"

# state -> (shape, colour): run statuses, tool outcomes, approval verdicts.
STATES = {
    "running": ("running", BLUE),
    "success": ("check", GREEN),
    "ok": ("check", GREEN),
    "allowed": ("check", GREEN),
    "completed": ("check", GREEN),
    "finished": ("warning", AMBER),  # a success with calls that were denied, blocked or failed
    "error": ("cross", RED),
    "denied": ("ban", RED),
    "blocked": ("ban", AMBER),
    "timeout": ("clock", GREY),
    "stopped": ("stop", GREY),
    "interrupted": ("stop", GREY),
    "suspended": ("stop", GREY),  # an approval given up at shutdown, asked again later
    "pending": ("hourglass", "#e0a800"),
    "waiting": ("hourglass", "#e0a800"),
}


def color_of(state: str) -> str:
    """The colour of a state (red for an unknown one)."""
    return STATES.get(state, ("cross", RED))[1]


def icon(state: str, *, label: str | None = None) -> str:
    """An inline SVG icon for a state (a red cross when unknown), labelled for screen readers."""
    shape, color = STATES.get(state, ("cross", RED))
    if state in _SHAPES:  # a shape asked for by name (``icon("download")``)
        shape, color = state, "currentColor"
    name = html.escape(label if label is not None else state)
    return (
        f'<svg class="ania-icon ania-icon-{shape}" viewBox="0 0 16 16" width="1em" height="1em"'
        f' role="img" aria-label="{name}" style="vertical-align:-0.125em;color:{color};'
        f'flex:none">{_SHAPES[shape]}</svg>'
    )
