"""Images as typed parts of a message's or a tool output's content (pure).

An image part the HTTP edge accepted (``http/image_inputs.py``) becomes an ``ImageRef`` in the
decoded body, in place of its JSON part; the item readers (``items.py``, Anthropic's
``anthropic_messages.py``, ``conversation_items.py``) put it in the item's ``Content``; stored
and listed items show it as an ``input_image`` part (``content_parts``), which ``items.read_item``
reads back into the same ``ImageRef``. The chat messages carry the ``Content`` as it is, and the
model's renderer (``model/vision.py``) writes each image as the template writes one.

Invariants:
- An ``ImageRef`` never comes from client JSON: decoded JSON holds only dicts, lists, strings,
  numbers, booleans and nulls, so an image in an item is one the edge checked (or one this
  server stored), and no client text needs a guard. A client's U+E000 is plain text.
- ``Content`` is normalized (``content_of``): a plain ``str`` when it holds no image, else a
  tuple of text runs and images in order with no empty run and no two runs side by side, so
  equal contents compare equal however they were built (``read_item(item_json(x)) == x``).
- An ``ImageRef``'s ``url`` is a ``data:`` URL of the image's bytes, its ``detail`` one of
  ``DETAILS``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, TypeGuard

DETAILS: Final = ("auto", "low", "high")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An accepted image: its data URL and the detail it was asked at."""

    url: str
    detail: str = "auto"


Piece = str | ImageRef
Content = str | tuple[Piece, ...]
"""A message's or a tool output's content: its text, or its text runs and images in order."""


def content_of(pieces: Iterable[Piece]) -> Content:
    """``pieces`` as normalized ``Content`` (see the module header)."""
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, ImageRef):
            out.append(piece)
        elif piece and out and isinstance(out[-1], str):
            out[-1] += piece
        elif piece:
            out.append(piece)
    if not any(isinstance(piece, ImageRef) for piece in out):
        return "".join(p for p in out if isinstance(p, str))
    return tuple(out)


def pieces_of(content: Content) -> tuple[Piece, ...]:
    """``content``'s text runs and images, in order (an empty text: none)."""
    if isinstance(content, str):
        return (content,) if content else ()
    return content


def holds_images(content: object) -> TypeGuard[tuple[Piece, ...]]:
    """Whether ``content`` (a ``Content``, or any chat message's content) holds an image."""
    return isinstance(content, tuple) and any(isinstance(p, ImageRef) for p in content)


def images_of(content: Content) -> list[ImageRef]:
    return [piece for piece in pieces_of(content) if isinstance(piece, ImageRef)]


def join_content(contents: Iterable[Content], separator: str = "") -> Content:
    """``contents`` one after another, ``separator`` between each two (as ``str.join``)."""
    pieces: list[Piece] = []
    for i, content in enumerate(contents):
        if i:
            pieces.append(separator)
        pieces.extend(pieces_of(content))
    return content_of(pieces)


def text_of(content: Content, image_text: str = "") -> str:
    """``content`` as text, each image written as ``image_text``."""
    if isinstance(content, str):
        return content
    return "".join(image_text if isinstance(p, ImageRef) else p for p in content)


def image_part(image: ImageRef) -> dict[str, object]:
    """An image's stored and listed part (the shape OpenAI lists an image input in)."""
    return {"type": "input_image", "image_url": image.url, "detail": image.detail}


def content_parts(content: Content, text_type: str) -> list[dict[str, object]]:
    """The content parts of ``content`` holding images: ``text_type`` parts and
    ``input_image`` parts."""
    return [
        image_part(piece) if isinstance(piece, ImageRef) else {"type": text_type, "text": piece}
        for piece in pieces_of(content)
    ]
