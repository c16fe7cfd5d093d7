"""``input_file`` parts: read the file (by id from the file store, or inline ``file_data``) and
hand it to the model as text, before the body is parsed.

Invariants:
- Runs at the HTTP edge on the decoded JSON, before ``parse_create_request``: every
  ``input_file`` part of a message is replaced by an ``input_text`` part holding the file's
  text, wrapped with its name, so everything downstream (rendering, storage, chains) sees text.
- A file id of another tenant, or an unknown, expired or evicted one, is a 400
  ``file_not_found`` naming the path; a file whose type is not text-like or PDF is a 400 naming
  its type; ``file_url`` is a 400 (the server fetches nothing from the network).
- Extraction (PDF parsing can be slow) runs on a worker thread; nothing is stored or changed
  when any part is refused.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import trio

from ..actors.file_store import FileStoreHandle
from ..protocol.errors import invalid_request
from ..protocol.files import extract_text


def _decode_file_data(value: object, path: str) -> tuple[bytes, str | None]:
    """``file_data``: a ``data:<type>;base64,<data>`` URL or bare base64 -> (bytes, type)."""
    if not isinstance(value, str) or not value:
        raise invalid_request(
            f"Invalid value for '{path}.file_data': expected base64 data or a data URL.",
            f"{path}.file_data",
        )
    content_type: str | None = None
    data = value
    if value.startswith("data:"):
        header, _, data = value.partition(",")
        if not header.endswith(";base64"):
            raise invalid_request(
                f"Invalid value for '{path}.file_data': a data URL must be base64 encoded.",
                f"{path}.file_data",
            )
        content_type = header.removeprefix("data:").removesuffix(";base64") or None
    try:
        return base64.b64decode(data, validate=True), content_type
    except (binascii.Error, ValueError):
        raise invalid_request(
            f"Invalid value for '{path}.file_data': it is not valid base64.",
            f"{path}.file_data",
        ) from None


async def _file_text(part: dict[str, Any], path: str, files: FileStoreHandle, owner: str) -> str:
    if part.get("file_url") is not None:
        raise invalid_request(
            f"Invalid value for '{path}.file_url': this server does not fetch files from URLs; "
            "upload the file (POST /v1/files) and send its file_id, or send file_data.",
            f"{path}.file_url",
        )
    file_id = part.get("file_id")
    name: str | None
    content_type: str | None
    if file_id is not None:
        stored = await files.get(str(file_id), owner) if isinstance(file_id, str) else None
        if stored is None:
            raise invalid_request(
                f"File '{file_id}' not found.", f"{path}.file_id", code="file_not_found"
            )
        data, name, content_type = stored.data, stored.filename, stored.content_type
    elif "file_data" in part:
        data, content_type = _decode_file_data(part["file_data"], path)
        filename = part.get("filename")
        name = filename if isinstance(filename, str) else None
    else:
        raise invalid_request(
            f"Missing required parameter: '{path}.file_id' (or '{path}.file_data').",
            f"{path}.file_id",
        )
    text = await trio.to_thread.run_sync(
        lambda: extract_text(data, filename=name, content_type=content_type, param=path)
    )
    return f'<file name="{name or "file"}">\n{text}\n</file>'


async def inline_file_inputs(body: object, files: FileStoreHandle, owner: str) -> object:
    """``body`` with every ``input[i].content[j]`` ``input_file`` part turned into text."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body
    new_input: list[Any] = []
    changed = False
    for i, item in enumerate(body["input"]):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == "input_file" for p in content
        ):
            new_input.append(item)
            continue
        parts: list[Any] = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "input_file":
                text = await _file_text(part, f"input[{i}].content[{j}]", files, owner)
                parts.append({"type": "input_text", "text": text})
            else:
                parts.append(part)
        new_input.append({**item, "content": parts})
        changed = True
    return {**body, "input": new_input} if changed else body
