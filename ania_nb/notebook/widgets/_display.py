"""How a view shows itself: the widget plus static fallbacks, refreshable in place.

The MIME bundle carries the widget view, the view's ``html()`` (when it has one) and its
``text()``. JupyterLab always prefers the widget view and, once the kernel is gone, shows "Error
displaying widget: model not found" instead of falling back — so a view that is no longer
``live`` (a finished run) drops the widget view and leaves its static HTML in the notebook.
"""

from __future__ import annotations

from typing import Any


class Displayable:
    """Base of the views: a ``widget``, a ``text()`` rendering and the static fallbacks."""

    widget: Any
    _display_handle: Any = None

    def text(self) -> str:
        """Plain-text rendering (overridden by each view)."""
        raise NotImplementedError

    def html(self) -> str | None:
        """Static HTML rendering (None: the view has none)."""
        return None

    @property
    def live(self) -> bool:
        """Whether the widget is still needed (False: the static HTML says it all)."""
        return True

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view (while live), ``html()`` and ``text()`` as fallbacks."""
        bundle: dict[str, Any] = {}
        static = self.html()
        widget_bundle = getattr(self.widget, "_repr_mimebundle_", None)  # None once closed
        if callable(widget_bundle) and (self.live or static is None):
            bundle.update(widget_bundle(**kwargs) or {})
        if static is not None:
            bundle["text/html"] = static
        bundle["text/plain"] = self.text()
        return bundle

    def _ipython_display_(self) -> None:
        """Display with a display id, so `refresh_display` can update the saved text later."""
        from IPython.display import display

        self._display_handle = display(self._repr_mimebundle_(), raw=True, display_id=True)

    def refresh_display(self) -> None:
        """Re-send the output (the plain text saved in the notebook follows the final state)."""
        if self._display_handle is not None:
            self._display_handle.update(self._repr_mimebundle_(), raw=True)


def close_tree(widget: Any) -> None:
    """Close a widget and all its descendants (their comms go away with them)."""
    for child in getattr(widget, "children", ()):
        close_tree(child)
    widget.close()
