"""`meme`: search a sticker/GIF API and send one result to the user.

The API is a URL template (``${msg}``, ``${num}``, ``${key}``) plus two JMESPath expressions: where
the result list is (``list_path``) and where each result's image URL is (``img_field``). Any API
that returns a list of image URLs fits; the default is GIPHY stickers.
"""

from __future__ import annotations

import base64
import random
from typing import Annotated, Any, ClassVar
from urllib.parse import quote

from pydantic import BaseModel, Field

from ...config import MemeSettings
from ...engine.callbacks import CallbackName
from ...errors import ToolError
from ..base import BaseTool, ToolContext
from ._http import HttpSource, get_ok


class MemeParams(BaseModel):
    """meme parameters."""

    text: Annotated[str, Field(description="A short mood or phrase to find a sticker for.")]


def expand_template(template: str, *, msg: str, num: int, key: str) -> str:
    """Fill the URL template; the search text and key are URL-escaped."""
    return (
        template.replace("${msg}", quote(msg, safe=""))
        .replace("${num}", str(num))
        .replace("${key}", quote(key, safe=""))
    )


def extract_urls(payload: Any, list_path: str, img_field: str) -> list[str]:
    """Image URLs found at ``list_path`` → each item's ``img_field`` (JMESPath), blanks skipped."""
    import jmespath

    try:
        items = jmespath.search(list_path, payload)
        field = jmespath.compile(img_field)
    except jmespath.exceptions.JMESPathError as exc:
        raise ToolError(f"meme.list_path/img_field is not a valid JSON path: {exc}") from None
    if not isinstance(items, list):
        return []
    urls = [field.search(item) for item in items]
    return [u for u in urls if isinstance(u, str) and u.strip()]


class MemeTool(BaseTool[MemeParams]):
    """Send the user a sticker that matches a mood or phrase."""

    name = "meme"
    requires: ClassVar[tuple[CallbackName, ...]] = ("send_image",)
    side_effects = True

    def __init__(self, settings: MemeSettings, http: HttpSource) -> None:
        self.settings = settings
        self.http = http

    async def execute(self, params: MemeParams, ctx: ToolContext) -> str:
        """Search, pick one result at random, download it and send it as an image."""
        text = params.text.strip()
        if not text:
            raise ToolError("text must not be empty")
        if not ctx.callbacks.has("send_image"):
            raise ToolError("this conversation cannot show images, so no sticker was sent")
        key = self.settings.key.get_secret_value() if self.settings.key else ""
        if "${key}" in self.settings.url and not key:
            raise ToolError(
                "the meme API needs a key and none is configured: ask the administrator to set "
                "meme.key (a free GIPHY API key from developers.giphy.com, or ANIA_MEME__KEY)"
            )
        url = expand_template(self.settings.url, msg=text, num=self.settings.num, key=key)
        payload = await self._fetch_json(url)
        urls = extract_urls(payload, self.settings.list_path, self.settings.img_field)
        if not urls:
            raise ToolError(f"no sticker found for {text!r}")
        image = await self._download(random.choice(urls))
        await ctx.callbacks.call("send_image", base64.b64encode(image).decode("ascii"))
        return f"sent a sticker about {text!r} to the user"

    async def _fetch_json(self, url: str) -> Any:
        response = await get_ok(self.http, url, what="meme API", seconds=self.settings.timeout)
        try:
            return response.json()
        except ValueError:
            raise ToolError("meme API answered with something that is not JSON") from None

    async def _download(self, url: str) -> bytes:
        seconds = self.settings.timeout
        return (await get_ok(self.http, url, what="sticker download", seconds=seconds)).content
