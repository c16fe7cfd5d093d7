"""What the storage backend tests share: a settable clock and a small stored response."""

from __future__ import annotations

from mlx_responses.storage.interface import StoredResponse


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(
    response_id: str, text: str = "hello", owner: str = "", **extra: object
) -> StoredResponse:
    """A completed response with one user message, ``extra`` keys on the response object."""
    response = {"id": response_id, "object": "response", "status": "completed", "output": []}
    response.update(extra)
    return StoredResponse(response, ({"id": "msg_1", "role": "user", "content": text},), (), owner)
