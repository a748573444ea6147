"""`load_images` and `local_image`: let the model see images.

A multimodal model gets the images queued into the next round (each labelled ``[image <hash8>]``);
otherwise a configured vision model describes them in text; otherwise the tool says plainly that
images cannot be viewed.
"""

from __future__ import annotations

import asyncio
import base64
from typing import TYPE_CHECKING, Annotated, ClassVar

from pydantic import BaseModel, Field

from ...engine.callbacks import CallbackName
from ...engine.messages import Message, image_hash, image_marker
from ...errors import AniaError, ToolError
from ..base import BaseTool, ToolContext
from ._paths import FileGuard

if TYPE_CHECKING:  # pragma: no cover
    from ...engine.llm import LLMClient

CANNOT_VIEW = (
    "the main model cannot view images and no vision model is configured "
    "(set vision.multimodal = true, or vision.model to a model that can describe images)"
)


def image_type(data: bytes) -> str | None:
    """The MIME type of an image by its magic number (PNG, JPEG, GIF, WEBP, BMP), else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    # "BM" alone is too weak (text may start so): the DIB header size must be a known one.
    dib_sizes = {12, 40, 52, 56, 64, 108, 124}
    if data[:2] == b"BM" and len(data) >= 26 and int.from_bytes(data[14:18], "little") in dib_sizes:
        return "image/bmp"
    return None


class ImageViewer:
    """Shows images to the model: queued (multimodal) or described by the vision model."""

    def __init__(self, *, multimodal: bool, describer: LLMClient | None, prompt: str) -> None:
        self.multimodal = multimodal
        self.describer = describer
        self.prompt = prompt

    @property
    def can_view(self) -> bool:
        """Whether images reach the model at all (natively or described)."""
        return self.multimodal or self.describer is not None

    def require(self) -> None:
        """Raise `ToolError` (`CANNOT_VIEW`) when images cannot reach the model."""
        if not self.can_view:
            raise ToolError(CANNOT_VIEW)

    async def show(self, urls: list[str], ctx: ToolContext, what: str) -> str:
        """Queue or describe ``urls``; returns the text for the model (`CANNOT_VIEW` if neither)."""
        labels = ", ".join(image_marker(u) for u in urls)
        if self.multimodal:
            for url in urls:
                ctx.queue_image(url)
            return f"loaded {what} ({labels}); you will see them in the next step"
        if self.describer is None:
            return CANNOT_VIEW
        described = await asyncio.gather(*(self._describe(url, ctx) for url in urls))
        return "the main model cannot view images; descriptions follow:" + "".join(described)

    async def _describe(self, url: str, ctx: ToolContext) -> str:
        assert self.describer is not None
        tag = f"image {image_hash(url)}"
        parts = [
            {"type": "text", "text": self.prompt},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        sent: list[Message] = [{"role": "user", "content": parts}]
        try:
            completion = await self.describer.complete(sent)
        except AniaError as exc:
            return f"\n<{tag}>description failed: {exc}</{tag}>"
        usage = ctx.run_state.get("usage")  # the run's tally: vision tokens count as the run's
        if usage is not None:
            usage.add_completion(completion, sent, count_iteration=False)
        text = (completion.message.get("content") or "").strip() or "(no description)"
        return f"\n<{tag}>\n{text}\n</{tag}>"


class NoParams(BaseModel):
    """No parameters."""


class LocalImageParams(BaseModel):
    """local_image parameters."""

    path: Annotated[str, Field(description="Path of a local image file (png, jpg, gif, webp).")]


class LoadImagesTool(BaseTool[NoParams]):
    """Load the images of the user's current (or quoted) message so you can see them.

    Call it only when you need the images' content; they are referred to as [image <hash>].
    Calling it twice in one request does nothing new.
    """

    name = "load_images"
    requires: ClassVar[tuple[CallbackName, ...]] = ("load_images",)

    def __init__(self, viewer: ImageViewer) -> None:
        self.viewer = viewer

    async def execute(self, params: NoParams, ctx: ToolContext) -> str:
        """Fetch the message's images from the front end and show them to the model."""
        if ctx.run_state.get("images_loaded"):
            return "the images are already loaded in this request; no need to call again"
        if not ctx.callbacks.has("load_images"):
            raise ToolError("this conversation cannot provide the user's images")
        self.viewer.require()  # a tool that cannot work here answers with an error
        # Claimed before the first await: parallel calls in one round must not load twice.
        ctx.run_state["images_loaded"] = True
        try:
            found = await ctx.callbacks.call("load_images") or []
        except BaseException:
            ctx.run_state["images_loaded"] = False
            raise
        urls = list(dict.fromkeys(u for u in found if u))
        if not urls:
            ctx.run_state["images_loaded"] = False
            return "no loadable images in the current or quoted message"
        return await self.viewer.show(urls, ctx, f"{len(urls)} image(s)")


class LocalImageTool(BaseTool[LocalImageParams]):
    """Look at an image file on this machine."""

    name = "local_image"

    def __init__(self, viewer: ImageViewer, guard: FileGuard) -> None:
        self.viewer = viewer
        self.guard = guard
        self.description = (
            "Look at an image file on this machine (png, jpg, gif, webp, bmp; at most "
            f"{guard.max_bytes} bytes), only in the allowed folders (file.roots, default the "
            "working directory); system files, the agent's data directory and files holding "
            "secrets are refused."
        )

    async def execute(self, params: LocalImageParams, ctx: ToolContext) -> str:
        """Read the file as a data URI and show it."""
        path, data = await self.guard.read(params.path)  # its refusals come first
        self.viewer.require()
        mime = image_type(data)
        if mime is None:
            raise ToolError(
                f"{path.name} is not an image: its content is not PNG, JPEG, GIF, WEBP or BMP"
            )
        uri = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        return await self.viewer.show([uri], ctx, f"local image {path}")
