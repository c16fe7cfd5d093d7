"""The batch's sizes (prefill chunk, decode batch, prompt batch) chosen from the device MLX
runs on, where no flag sets them.

Invariants:
- A flag always wins: a size given on the command line (or its environment variable) is used
  as given, and its source is ``flag``; the others are the device's defaults, ``device default``.
- The pure part (``device_defaults``, ``choose_sizes``) decides from the device's kind, its
  memory and the model's weight bytes; ``detect_device`` only asks MLX, on the generation
  thread (the only thread that calls MLX).
- On the CPU the defaults are fixed (512, 32, 8): a cancel during prefill waits at most one
  chunk, and a 512-token chunk is a short wait on a CPU. On a GPU a long chunk costs little
  more than a short one (measured on an H200 with the CUDA backend and a 4B model: the time to
  first token of a 2,000-token prompt fell from 0.90x mlx_lm.server's at 512 to 0.56x at
  2048), so a GPU prefills 2048 tokens per chunk; and a CUDA GPU decodes 64 sequences per
  step where the memory left after the weights allows (its throughput still grew from 16 to
  64 streams there). Less memory never gives larger sizes, a larger model never gives larger
  ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final, Literal

DeviceKind = Literal["cpu", "metal", "cuda"]
Source = Literal["flag", "device default"]

GIB: Final = 1 << 30
CPU_SIZES: Final = (512, 32, 8)
GPU_PREFILL_STEP: Final = 2048
SMALL_GPU_PREFILL_STEP: Final = 1024
# Bounds on the memory a GPU has left after the model's weights (``headroom``).
SMALL_HEADROOM: Final = 8 * GIB
LARGE_HEADROOM: Final = 32 * GIB

FLAG_NAMES: Final = ("--prefill-step-size", "--decode-concurrency", "--prompt-concurrency")


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What the sizes are chosen from: the device's kind, its memory in bytes (0: unknown)
    and the model's weight bytes (None: unknown)."""

    kind: DeviceKind
    memory_bytes: int = 0
    model_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class SizeFlags:
    """The three flags as given (None: not set)."""

    prefill_step_size: int | None = None
    completion_batch_size: int | None = None
    prefill_batch_size: int | None = None


@dataclass(frozen=True, slots=True)
class Sizes:
    """The sizes the batch runs with, each with its source, and why the device's are what
    they are (``reason``)."""

    prefill_step_size: int
    completion_batch_size: int
    prefill_batch_size: int
    sources: tuple[Source, Source, Source]
    device: DeviceKind
    reason: str

    def describe(self) -> str:
        """The start-up line."""
        flagged = [name for name, s in zip(FLAG_NAMES, self.sources, strict=True) if s == "flag"]
        given = "no flag set" if not flagged else f"{', '.join(flagged)} set"
        return (
            f"sizes: prefill step {self.prefill_step_size}, decode batch "
            f"{self.completion_batch_size}, prompt batch {self.prefill_batch_size} "
            f"({self.device}: {self.reason}; {given})"
        )

    def to_json(self) -> dict[str, Any]:
        values = (self.prefill_step_size, self.completion_batch_size, self.prefill_batch_size)
        names = ("prefill_step_size", "decode_batch_size", "prompt_batch_size")
        return {
            **{
                name: {"value": value, "source": source, "flag": flag}
                for name, value, source, flag in zip(
                    names, values, self.sources, FLAG_NAMES, strict=True
                )
            },
            "device": self.device,
            "reason": self.reason,
        }


def headroom(facts: DeviceFacts) -> int:
    """The memory left for the batch: the device's less the weights (half of it when the
    model's size is not known); 0 when the memory is not known."""
    if facts.memory_bytes <= 0:
        return 0
    if facts.model_bytes is None:
        return facts.memory_bytes // 2
    return max(facts.memory_bytes - facts.model_bytes, 0)


def device_defaults(facts: DeviceFacts) -> tuple[int, int, int, str]:
    """(prefill step, decode batch, prompt batch, why) for a device no flag overrides."""
    if facts.kind == "cpu":
        return (*CPU_SIZES, "a cancel during prefill waits at most one short chunk")
    room = headroom(facts)
    if room < SMALL_HEADROOM:
        return (
            SMALL_GPU_PREFILL_STEP,
            16,
            4,
            "a GPU prefills long chunks fast; under 8 GiB left after the weights",
        )
    if facts.kind == "cuda" and room >= LARGE_HEADROOM:
        return (
            GPU_PREFILL_STEP,
            64,
            8,
            "a GPU prefills long chunks fast and decodes more streams per step; "
            "32 GiB or more left after the weights",
        )
    return GPU_PREFILL_STEP, 32, 8, "a GPU prefills long chunks fast"


def choose_sizes(flags: SizeFlags, facts: DeviceFacts) -> Sizes:
    """The sizes to run with: each flag given, else the device's default."""
    *defaults, reason = device_defaults(facts)
    given = (flags.prefill_step_size, flags.completion_batch_size, flags.prefill_batch_size)
    chosen = [d if g is None else g for g, d in zip(given, defaults, strict=True)]
    sources: list[Source] = ["device default" if g is None else "flag" for g in given]
    return Sizes(
        chosen[0],
        chosen[1],
        chosen[2],
        (sources[0], sources[1], sources[2]),
        facts.kind,
        str(reason),
    )


# -- the device, asked of MLX (generation thread only) -----------------------------------------


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def device_kind() -> DeviceKind:
    """The kind of MLX's default device: a GPU is Metal or CUDA by which backend is there."""
    import mlx.core as mx

    if mx.default_device().type != mx.DeviceType.gpu:
        return "cpu"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return "metal"


def detect_device(model: Any) -> DeviceFacts:
    """The default device's kind, its memory (a GPU's own, as MLX reports it; the machine's
    for the CPU, and for a GPU that reports none) and the model's weight bytes (metadata
    only: nothing is evaluated)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    kind = device_kind()
    memory = 0
    if kind != "cpu":
        try:
            info = mx.device_info()
        except Exception:
            info = {}
        for key in ("total_memory", "memory_size"):
            value = info.get(key)
            if isinstance(value, int) and value > 0:
                memory = value
                break
    try:
        weights: int | None = sum(int(a.nbytes) for _, a in tree_flatten(model.parameters()))
    except Exception:
        weights = None
    return DeviceFacts(kind, memory or _physical_memory(), weights)
