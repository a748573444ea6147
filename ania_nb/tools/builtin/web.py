"""`webSearch` and `webExplore`: Jina's search and reader APIs.

Endpoints are configurable (``web.search_url`` / ``web.reader_url``) so tests and self-hosted
readers can stand in for Jina. Results are truncated to ``web.max_chars`` characters.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from ...config import WebSettings
from ...errors import ToolError
from ...text import cut
from ..base import BaseTool, ToolContext
from ._http import HttpSource, get_ok

# What the original sends to Jina's reader: render like a browser, no images, a links summary.
READER_HEADERS = {
    "X-Referer": "https://www.google.com/",
    "X-User-Agent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36",
    "X-Retain-Images": "none",
    "X-With-Links-Summary": "true",
    "X-Engine": "cf-browser-rendering",
}


class SearchParams(BaseModel):
    """webSearch parameters."""

    query: Annotated[str, Field(description="What to search for.")]
    page: Annotated[int | None, Field(description="Result page, 1-based (optional).")] = None


class ExploreParams(BaseModel):
    """webExplore parameters."""

    url: Annotated[str, Field(description="The http(s) URL of the page to read.")]


class _JinaTool:
    def __init__(self, settings: WebSettings, http: HttpSource) -> None:
        self.settings = settings
        self.http = http

    def _auth(self) -> dict[str, str]:
        token = self.settings.token.get_secret_value() if self.settings.token else ""
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _get(self, what: str, url: str, **kwargs: Any) -> str:
        response = await get_ok(self.http, url, what=what, seconds=self.settings.timeout, **kwargs)
        return cut(response.text, self.settings.max_chars, marker="...")


class WebSearchTool(_JinaTool, BaseTool[SearchParams]):
    """Search the web (Jina)."""

    name = "webSearch"

    def __init__(self, settings: WebSettings, http: HttpSource) -> None:
        super().__init__(settings, http)
        self.description = (
            "Search the web and get result titles, URLs and snippets. Use webExplore to read a "
            f"result in full. Output is truncated to {settings.max_chars} characters; requests "
            f"time out after {settings.timeout:g} s."
        )

    async def execute(self, params: SearchParams, ctx: ToolContext) -> str:
        """Run the search."""
        if not params.query.strip():
            raise ToolError("query must not be empty")
        query: dict[str, str | int] = {"q": params.query}
        if params.page is not None:
            if params.page < 1:
                raise ToolError("page starts at 1")
            query["page"] = params.page
        headers = {**self._auth(), "X-Respond-With": "no-content"}
        return await self._get(
            "web search", self.settings.search_url, params=query, headers=headers
        )


class WebExploreTool(_JinaTool, BaseTool[ExploreParams]):
    """Read a web page as text (Jina reader)."""

    name = "webExplore"

    def __init__(self, settings: WebSettings, http: HttpSource) -> None:
        super().__init__(settings, http)
        self.description = (
            "Read a web page as Markdown text, with a summary of its links. Output is truncated "
            f"to {settings.max_chars} characters; requests time out after {settings.timeout:g} s."
        )

    async def execute(self, params: ExploreParams, ctx: ToolContext) -> str:
        """Fetch the page through the reader."""
        url = params.url.strip()
        if not url.startswith(("http://", "https://")):
            raise ToolError(f"url must start with http:// or https://, got {url[:100]!r}")
        headers = {**self._auth(), **READER_HEADERS}
        return await self._get("web page fetch", self.settings.reader_url + url, headers=headers)
