"""mlx-responses: a local server for the OpenAI Responses API running one MLX model."""

from __future__ import annotations

__version__ = "0.1.0"
