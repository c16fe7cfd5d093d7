"""Images inside message text: the marker an accepted image travels as (issue 27).

An image part the HTTP edge accepted (``http/image_inputs.py``) becomes a marker inside the
text of its message or tool output, so the items, their storage, replay, chains and
conversations carry it as they carry text, with no new item shape. The model's renderer
(``model/vision.py``) turns each marker into the model's image tokens; ``item_json`` shows it
as an ``input_image`` part again.

Invariants:
- A marker is ``\\ue000image <detail> <data URL>\\ue001``: private-use characters that no
  client text carries (the edge refuses a client string holding ``OPEN``: ``marker_at``), a
  detail from ``DETAILS`` and a ``data:`` URL of the image's bytes. ``split_text`` and ``marker`` round-trip.
- Pure: no I/O, no decoding of the image itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

OPEN: Final = "\ue000image "
CLOSE: Final = "\ue001"
DETAILS: Final = ("auto", "low", "high")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An accepted image: its data URL and the detail it was asked at."""

    url: str
    detail: str = "auto"


def marker(image: ImageRef) -> str:
    return f"{OPEN}{image.detail} {image.url}{CLOSE}"


def has_images(text: str) -> bool:
    return OPEN in text


def split_text(text: str) -> list[str | ImageRef]:
    """``text`` as its text runs and images, in order (empty runs left out)."""
    pieces: list[str | ImageRef] = []
    rest = text
    while True:
        start = rest.find(OPEN)
        end = rest.find(CLOSE, start) if start >= 0 else -1
        if start < 0 or end < 0:
            if rest:
                pieces.append(rest)
            return pieces
        if start:
            pieces.append(rest[:start])
        detail, _, url = rest[start + len(OPEN) : end].partition(" ")
        pieces.append(ImageRef(url, detail if detail in DETAILS else "auto"))
        rest = rest[end + len(CLOSE) :]


def image_parts(text: str, text_type: str) -> list[dict[str, object]]:
    """The content parts of a text holding images: ``text_type`` parts and ``input_image``
    parts (the shape OpenAI lists an image input in)."""
    parts: list[dict[str, object]] = []
    for piece in split_text(text):
        if isinstance(piece, ImageRef):
            parts.append({"type": "input_image", "image_url": piece.url, "detail": piece.detail})
        else:
            parts.append({"type": text_type, "text": piece})
    return parts


def marker_at(value: object, path: Sequence[str | int] = ()) -> tuple[str | int, ...] | None:
    """Where, in a client's JSON ``value``, a string holds a marker's opening (the keys and
    indexes down to it), else None: such text would pass for an image the edge never took."""
    if isinstance(value, str):
        return tuple(path) if OPEN in value else None
    if isinstance(value, dict):
        items: list[tuple[str | int, object]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return None
    for key, inner in items:
        found = marker_at(inner, (*path, key))
        if found is not None:
            return found
    return None
