"""mlx-responses: a local server for the OpenAI Responses API running one MLX model."""

from __future__ import annotations

from .blas import preload_openblas

__version__ = "0.1.0"

# OpenBLAS before MLX for whoever imports this package first (the entry point, the
# test suite, the benchmarks); MLX_RESPONSES_OPENBLAS=0 skips it.
preload_openblas()
