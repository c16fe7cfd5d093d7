"""Image inputs at the HTTP edge: every image a request carries is read, decoded and run through
the model's image processor before the body is parsed, and its part becomes an ``ImageRef`` in
the decoded body (``protocol/images.py``), which the parsers take as a typed image part.

Invariants:
- Runs on the decoded JSON, before ``parse_create_request`` / ``parse_messages_request``, and
  only for a vision model: on a text-only model the parts stay as sent and the parser refuses
  them with its "text-only" 400. Decoded JSON never holds an ``ImageRef``, so what a parser
  takes as an image is one this edge checked; client text is never searched for anything.
- Where images arrive: a Responses ``input_image`` part of a message or of a
  ``function_call_output`` (Codex's ``view_image``), with ``image_url`` as a data URL or a
  ``file_id`` from ``/v1/files``; an Anthropic ``image`` block of a message or of a
  ``tool_result``, with a ``base64`` or ``file`` source. An ``http(s)`` URL is a 400 unless
  ``--image-urls fetch``: by default the server reaches no network on a client's word
  (docs/vision.md says why); fetched, it is bounded in time and bytes.
- A bad image (not decodable, too many bytes or pixels, refused by the processor) is a 400
  naming the part, before any model work; nothing is stored or changed. Decoding and the
  processor run on a worker thread (PIL and NumPy, no MLX).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import trio

from ..actors.file_store import FileStoreHandle
from ..protocol.errors import ApiError, invalid_request
from ..protocol.items.images import DETAILS, ImageRef
from ..text.prompt_maker import (
    MAX_IMAGE_BYTES,
    ImageError,
    VisionModel,
    decode_data_url,
    image_format,
)

_NO_URLS = (
    "this server does not fetch images from URLs (--image-urls refuse); send the image as a "
    "data URL (data:image/png;base64,...) or upload it (POST /v1/files) and send its file_id."
)
FETCH_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ImageSources:
    """Where images may come from for one request: the tenant's files, and the network."""

    files: FileStoreHandle
    owner: str
    vision: VisionModel
    fetch_urls: bool = False


def _download(url: str) -> bytes:
    """``url``'s body, at most ``MAX_IMAGE_BYTES`` (a worker thread; ``ImageError`` if not)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=FETCH_SECONDS) as reply:
            data: bytes = reply.read(MAX_IMAGE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ImageError(f"it could not be fetched ({exc})") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"it is larger than {MAX_IMAGE_BYTES} bytes")
    return data


def _bad(param: str, why: str) -> ApiError:
    return invalid_request(f"Invalid image at '{param}': {why}.", param)


async def _accepted(data: bytes, detail: str, param: str, sources: ImageSources) -> ImageRef:
    """``data`` as an accepted image, once the model's processor took it."""
    vision = sources.vision

    def check() -> str:
        kind = image_format(data)  # refuses what cannot be decoded
        url = f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"
        vision.prepare(ImageRef(url, detail))  # decoded, sized, processed (and kept)
        return url

    try:
        url = await trio.to_thread.run_sync(check)
    except ImageError as exc:
        raise _bad(param, str(exc)) from None
    return ImageRef(url, detail)


async def _from_url(url: str, detail: str, param: str, sources: ImageSources) -> ImageRef:
    if url.startswith("data:"):
        try:
            data = decode_data_url(url)
        except ImageError as exc:
            raise _bad(param, str(exc)) from None
    elif url.startswith(("http://", "https://")) and sources.fetch_urls:
        try:
            data = await trio.to_thread.run_sync(_download, url)
        except ImageError as exc:
            raise _bad(param, str(exc)) from None
    elif url.startswith(("http://", "https://")):
        raise invalid_request(f"Invalid value for '{param}': {_NO_URLS}", param)
    else:
        raise _bad(param, "expected a data URL (data:image/png;base64,...)")
    return await _accepted(data, detail, param, sources)


async def _from_file(file_id: object, detail: str, param: str, sources: ImageSources) -> ImageRef:
    stored = await sources.files.get(file_id, sources.owner) if isinstance(file_id, str) else None
    if stored is None:
        raise invalid_request(f"File '{file_id}' not found.", param, code="file_not_found")
    return await _accepted(stored.data, detail, param, sources)


async def _input_image(part: dict[str, Any], path: str, sources: ImageSources) -> ImageRef:
    detail = part.get("detail", "auto")
    if detail not in DETAILS:
        raise invalid_request(
            f"Invalid value for '{path}.detail': {detail!r}; supported values are "
            f"{', '.join(repr(d) for d in DETAILS)}.",
            f"{path}.detail",
        )
    url, file_id = part.get("image_url"), part.get("file_id")
    if isinstance(url, str) and url:
        return await _from_url(url, detail, f"{path}.image_url", sources)
    if file_id is not None:
        return await _from_file(file_id, detail, f"{path}.file_id", sources)
    raise invalid_request(
        f"Missing required parameter: '{path}.image_url' (or '{path}.file_id').",
        f"{path}.image_url",
    )


async def _parts(parts: list[Any], path: str, sources: ImageSources) -> list[Any] | None:
    """``parts`` with each ``input_image`` accepted; None when there is none."""
    if not any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
        return None
    out: list[Any] = []
    for j, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") == "input_image":
            out.append(await _input_image(part, f"{path}[{j}]", sources))
        else:
            out.append(part)
    return out


_OUTPUTS = ("function_call_output", "custom_tool_call_output")


async def inline_image_inputs(
    body: object, sources: ImageSources | None, key: str = "input"
) -> object:
    """A Responses body with every ``input_image`` part of its ``key`` items accepted (see the
    module header); ``key="items"``: a conversation's items (``/v1/conversations``)."""
    if sources is None or not isinstance(body, dict) or not isinstance(body.get(key), list):
        return body
    new_input: list[Any] = []
    changed = False
    for i, item in enumerate(body[key]):
        field = "output" if isinstance(item, dict) and item.get("type") in _OUTPUTS else "content"
        # An assistant's image stays as sent: the parser refuses it (as OpenAI does).
        takes = isinstance(item, dict) and item.get("role") != "assistant"
        parts = item.get(field) if takes else None
        replaced = (
            await _parts(parts, f"{key}[{i}].{field}", sources) if isinstance(parts, list) else None
        )
        new_input.append(item if replaced is None else {**item, field: replaced})
        changed = changed or replaced is not None
    return {**body, key: new_input} if changed else body


# --- /v1/messages ------------------------------------------------------------------------------


async def _image_block(block: dict[str, Any], path: str, sources: ImageSources) -> ImageRef:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    kind = source.get("type")
    if kind == "base64":
        try:
            data = base64.b64decode(str(source.get("data", "")), validate=True)
        except ValueError:
            raise _bad(f"{path}.source.data", "it is not valid base64") from None
        return await _accepted(data, "auto", f"{path}.source.data", sources)
    if kind == "file":
        return await _from_file(source.get("file_id"), "auto", f"{path}.source.file_id", sources)
    if kind == "url":
        url = source.get("url")
        return await _from_url(
            url if isinstance(url, str) else "", "auto", f"{path}.source.url", sources
        )
    raise invalid_request(
        f"Invalid value for '{path}.source.type': {kind!r}; supported: 'base64', 'file', 'url'.",
        f"{path}.source.type",
    )


async def _blocks(blocks: list[Any], path: str, sources: ImageSources) -> list[Any] | None:
    out: list[Any] = []
    changed = False
    for j, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "image":
            out.append(await _image_block(block, f"{path}.{j}", sources))
            changed = True
        elif (
            isinstance(block, dict)
            and block.get("type") == "tool_result"
            and isinstance(block.get("content"), list)
        ):
            inner = await _blocks(block["content"], f"{path}.{j}.content", sources)
            out.append(block if inner is None else {**block, "content": inner})
            changed = changed or inner is not None
        else:
            out.append(block)
    return out if changed else None


async def inline_message_images(body: object, sources: ImageSources | None) -> object:
    """A /v1/messages body with every image block accepted (see the module header)."""
    if sources is None or not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return body
    messages: list[Any] = []
    changed = False
    for i, message in enumerate(body["messages"]):
        content = message.get("content") if isinstance(message, dict) else None
        replaced = (
            await _blocks(content, f"messages.{i}.content", sources)
            if isinstance(content, list)
            else None
        )
        messages.append(message if replaced is None else {**message, "content": replaced})
        changed = changed or replaced is not None
    return {**body, "messages": messages} if changed else body
