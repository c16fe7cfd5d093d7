"""The ``mlx-responses`` entry point: OpenBLAS first (before anything imports MLX), then the CLI."""

from __future__ import annotations

from .blas import preload_openblas


def main() -> int:
    preload_openblas()
    from .cli import main as cli_main

    return cli_main()
