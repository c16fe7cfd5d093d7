"""API errors and OpenAI's error envelope.

Invariants:
- Every refusal the API answers is an :class:`ApiError`; its body is always
  ``{"error": {"message", "type", "param", "code"}}`` with all four keys present (null when
  unset), as OpenAI sends it.
- ``type`` uses OpenAI's vocabulary. OpenAI answers an unknown model *and* an unknown object
  (``GET /v1/responses/resp_missing``) with HTTP 404 and ``type: "invalid_request_error"``, so
  :func:`not_found` does the same (code ``model_not_found`` for a model).
- Raising one changes no state: the constructors are pure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "invalid_request", "not_found", "server_error"]


class ApiError(Exception):
    """An error answered to the client with an HTTP ``status`` and OpenAI's envelope."""

    status: int
    type: str
    message: str
    param: str | None
    code: str | None

    def __init__(
        self,
        status: int,
        type: str,  # noqa: A002 - OpenAI's field name
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.param = param
        self.code = code

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, type={self.type!r}, message={self.message!r}, "
            f"param={self.param!r}, code={self.code!r})"
        )


def invalid_request(message: str, param: str | None, code: str | None = None) -> ApiError:
    """400 ``invalid_request_error``; ``param`` names the offending field (or None)."""
    return ApiError(400, "invalid_request_error", message, param=param, code=code)


def context_exceeded(tokens: int, window: int, *, at_least: bool = False) -> ApiError:
    """400 ``context_length_exceeded``: a prompt of ``tokens`` tokens (``at_least``: refused
    before it was tokenized) leaves no room for output in a context window of ``window``."""
    size = f"at least {tokens}" if at_least else f"{tokens}"
    return invalid_request(
        f"The input is {size} tokens, which does not fit the model's context window of "
        f"{window} tokens.",
        "input",
        code="context_length_exceeded",
    )


def not_found(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """404 ``invalid_request_error`` (OpenAI's type for unknown models and objects)."""
    return ApiError(404, "invalid_request_error", message, param=param, code=code)


def server_error(message: str) -> ApiError:
    """500 ``server_error``."""
    return ApiError(500, "server_error", message)
