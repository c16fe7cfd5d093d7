"""Server-side defaults for request settings a client leaves out (docs/api.md).

Invariants:
- ``default_temperature()`` is ``ServerSettings.default_temperature`` (``--default-temperature``,
  env ``MLX_RESPONSES_DEFAULT_TEMPERATURE``), a float in 0..2, or None (the APIs' default,
  1.0, applies). A
  request's own ``temperature`` always wins; the Response echoes the temperature used. It
  applies to ``/v1/responses`` and ``/v1/messages`` alike.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..protocol.anthropic.request import MessagesRequest
from .common import runtime


def parse_temperature(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or not 0 <= value <= 2:
        raise ValueError(f"a default temperature must be in 0..2, got {raw!r}")
    return value


def default_temperature() -> float | None:
    """The running server's default temperature (its settings)."""
    return runtime().settings.default_temperature


def with_default_temperature(request: MessagesRequest) -> MessagesRequest:
    """A Messages request with the server's default temperature when it gave none."""
    default = default_temperature()
    config = request.create.config
    if default is None or config.temperature is not None:
        return request
    create = replace(request.create, config=replace(config, temperature=default))
    return replace(request, create=create)
