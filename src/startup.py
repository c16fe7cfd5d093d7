"""The start-up line: what is being served, and on which backend."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from .actors.model import ModelInfo
from .blas import HINT, openblas_loaded
from .engine.blas_threads import BlasThreads
from .engine.sizing import Sizes
from .engine.topology import Topology


def weights_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors") if f.is_file())


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def backend(device: str) -> tuple[str, bool]:
    """MLX's device in words, and whether it is the CPU without OpenBLAS (on Linux). The
    ``device`` is the model actor's (``ModelHandle.device``, asked of MLX on the generation
    thread at load): MLX is never called here, on the Trio thread."""
    where = device or "MLX on an unknown device"
    if "gpu" in where.lower():
        return where, False
    if sys.platform.startswith("linux"):
        blas = openblas_loaded()
        return f"{where} with {'OpenBLAS' if blas else 'the reference BLAS'}", not blas
    return where, False


def startup_line(
    info: ModelInfo,
    blas: BlasThreads | None = None,
    device: str = "",
    topology: Topology | None = None,
) -> tuple[str, bool]:
    """The line to log once the model is loaded; whether the BLAS hint applies."""
    where, slow = backend(device)
    if blas is not None:
        where += f", {blas.describe()}"
    tool_format = (
        "none known (tool calls are text; --tool-format NAME sets one)"
        if info.tool_format == "none"
        else info.tool_format
    )
    line = (
        f"model {info.alias} ({info.path}, {human_bytes(weights_bytes(info.path))} of weights), "
        f"context window {info.context_window} tokens, tool format {tool_format}, "
        f"reasoning {'yes' if info.has_thinking else 'no'}, "
        f"input_modalities: [{', '.join(repr(m) for m in info.input_modalities)}]; {where}"
    )
    if topology is not None:
        line += f"; {topology.describe()}"
    return line, slow


def log_startup(
    log: logging.Logger,
    info: ModelInfo,
    blas: BlasThreads | None = None,
    device: str = "",
    topology: Topology | None = None,
    sizes: Sizes | None = None,
) -> None:
    line, slow = startup_line(info, blas, device, topology)
    log.info("%s", line)
    if sizes is not None:
        log.info("%s", sizes.describe())  # the batch's sizes and why (engine/sizing.py)
    if slow:
        log.warning("%s", HINT)
