"""How a view shows itself: the widget plus a plain-text fallback, refreshable in place."""

from __future__ import annotations

from typing import Any


class Displayable:
    """Mixin for views with a ``widget`` and a ``text()`` rendering."""

    widget: Any
    _display_handle: Any = None

    def text(self) -> str:
        """Plain-text rendering (overridden by each view)."""
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, with ``text()`` as the text/plain fallback (nbconvert, terminals)."""
        bundle: dict[str, Any] = {}
        widget_bundle = getattr(self.widget, "_repr_mimebundle_", None)  # None once closed
        if callable(widget_bundle):
            bundle.update(widget_bundle(**kwargs) or {})
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
