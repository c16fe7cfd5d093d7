"""Image inputs at the HTTP edge (issue 27): every image a request carries is read, decoded and
run through the model's image processor before the body is parsed, and becomes a marker in the
text of its message (``protocol/images.py``).

Invariants:
- Runs on the decoded JSON, before ``parse_create_request`` / ``parse_messages_request``, and
  only for a vision model: on a text-only model the parts stay as sent and the parser refuses
  them with its "text-only" 400.
- Where images arrive: a Responses ``input_image`` part of a message or of a
  ``function_call_output`` (Codex's ``view_image``), with ``image_url`` as a data URL or a
  ``file_id`` from ``/v1/files``; an Anthropic ``image`` block of a message or of a
  ``tool_result``, with a ``base64`` or ``file`` source. An ``http(s)`` URL is a 400: the
  server fetches nothing from the network (docs/vision.md says why).
- A bad image (not decodable, too many bytes or pixels, refused by the processor) is a 400
  naming the part, before any model work; nothing is stored or changed. Decoding and the
  processor run on a worker thread (PIL and NumPy, no MLX).
"""

from __future__ import annotations

import base64
from typing import Any

import trio

from ..actors.file_store import FileStoreHandle
from ..model.vision import ImageError, VisionModel, decode_data_url, image_format
from ..protocol.errors import ApiError, invalid_request
from ..protocol.images import DETAILS, ImageRef, marker

_NO_URLS = (
    "this server does not fetch images from URLs; send the image as a data URL "
    "(data:image/png;base64,...) or upload it (POST /v1/files) and send its file_id."
)


def _bad(param: str, why: str) -> ApiError:
    return invalid_request(f"Invalid image at '{param}': {why}.", param)


async def _accepted(data: bytes, detail: str, param: str, vision: VisionModel) -> dict[str, Any]:
    """``data`` as a text part holding its marker, once the model's processor took it."""

    def check() -> str:
        kind = image_format(data)  # refuses what cannot be decoded
        url = f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"
        vision.prepare(ImageRef(url, detail))  # decoded, sized, processed (and kept)
        return url

    try:
        url = await trio.to_thread.run_sync(check)
    except ImageError as exc:
        raise _bad(param, str(exc)) from None
    return {"type": "input_text", "text": marker(ImageRef(url, detail))}


async def _stored_file(file_id: object, param: str, files: FileStoreHandle, owner: str) -> bytes:
    stored = await files.get(file_id, owner) if isinstance(file_id, str) else None
    if stored is None:
        raise invalid_request(f"File '{file_id}' not found.", param, code="file_not_found")
    return stored.data


async def _input_image(
    part: dict[str, Any], path: str, files: FileStoreHandle, owner: str, vision: VisionModel
) -> dict[str, Any]:
    detail = part.get("detail", "auto")
    if detail not in DETAILS:
        raise invalid_request(
            f"Invalid value for '{path}.detail': {detail!r}; supported values are "
            f"{', '.join(repr(d) for d in DETAILS)}.",
            f"{path}.detail",
        )
    url, file_id = part.get("image_url"), part.get("file_id")
    if isinstance(url, str) and url:
        if not url.startswith("data:"):
            raise invalid_request(
                f"Invalid value for '{path}.image_url': {_NO_URLS}", f"{path}.image_url"
            )
        try:
            data = decode_data_url(url)
        except ImageError as exc:
            raise _bad(f"{path}.image_url", str(exc)) from None
        return await _accepted(data, detail, f"{path}.image_url", vision)
    if file_id is not None:
        data = await _stored_file(file_id, f"{path}.file_id", files, owner)
        return await _accepted(data, detail, f"{path}.file_id", vision)
    raise invalid_request(
        f"Missing required parameter: '{path}.image_url' (or '{path}.file_id').",
        f"{path}.image_url",
    )


async def _parts(
    parts: list[Any], path: str, files: FileStoreHandle, owner: str, vision: VisionModel
) -> list[Any] | None:
    """``parts`` with each ``input_image`` accepted; None when there is none."""
    if not any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
        return None
    out: list[Any] = []
    for j, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") == "input_image":
            out.append(await _input_image(part, f"{path}[{j}]", files, owner, vision))
        else:
            out.append(part)
    return out


async def inline_image_inputs(
    body: object, files: FileStoreHandle, owner: str, vision: VisionModel | None
) -> object:
    """A Responses body with every ``input_image`` part accepted (see the module header)."""
    if vision is None or not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body
    new_input: list[Any] = []
    changed = False
    for i, item in enumerate(body["input"]):
        if not isinstance(item, dict):
            new_input.append(item)
            continue
        key = (
            "output"
            if item.get("type") in ("function_call_output", "custom_tool_call_output")
            else "content"
        )
        parts = item.get(key)
        replaced = (
            await _parts(parts, f"input[{i}].{key}", files, owner, vision)
            if isinstance(parts, list)
            else None
        )
        if replaced is None:
            new_input.append(item)
        else:
            new_input.append({**item, key: replaced})
            changed = True
    return {**body, "input": new_input} if changed else body


# --- /v1/messages ------------------------------------------------------------------------------


async def _image_block(
    block: dict[str, Any], path: str, files: FileStoreHandle, owner: str, vision: VisionModel
) -> dict[str, Any]:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        try:
            data = base64.b64decode(str(source.get("data", "")), validate=True)
        except ValueError:
            raise _bad(f"{path}.source.data", "it is not valid base64") from None
        part = await _accepted(data, "auto", f"{path}.source.data", vision)
    elif kind == "file" and isinstance(source, dict):
        data = await _stored_file(source.get("file_id"), f"{path}.source.file_id", files, owner)
        part = await _accepted(data, "auto", f"{path}.source.file_id", vision)
    elif kind == "url":
        raise invalid_request(f"Invalid value for '{path}.source': {_NO_URLS}", f"{path}.source")
    else:
        raise invalid_request(
            f"Invalid value for '{path}.source.type': {kind!r}; supported: 'base64', 'file'.",
            f"{path}.source.type",
        )
    return {"type": "text", "text": part["text"]}


async def _blocks(
    blocks: list[Any], path: str, files: FileStoreHandle, owner: str, vision: VisionModel
) -> list[Any] | None:
    out: list[Any] = []
    changed = False
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            out.append(block)
            continue
        if block.get("type") == "image":
            out.append(await _image_block(block, f"{path}.{j}", files, owner, vision))
            changed = True
        elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            inner = await _blocks(block["content"], f"{path}.{j}.content", files, owner, vision)
            out.append(block if inner is None else {**block, "content": inner})
            changed = changed or inner is not None
        else:
            out.append(block)
    return out if changed else None


async def inline_message_images(
    body: object, files: FileStoreHandle, owner: str, vision: VisionModel | None
) -> object:
    """A /v1/messages body with every image block accepted (see the module header)."""
    if vision is None or not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return body
    messages: list[Any] = []
    changed = False
    for i, message in enumerate(body["messages"]):
        content = message.get("content") if isinstance(message, dict) else None
        replaced = (
            await _blocks(content, f"messages.{i}.content", files, owner, vision)
            if isinstance(content, list)
            else None
        )
        messages.append(message if replaced is None else {**message, "content": replaced})
        changed = changed or replaced is not None
    return {**body, "messages": messages} if changed else body
