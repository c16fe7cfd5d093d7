"""The batch's sizes chosen from the device where no flag sets them (``engine/sizing.py``):
the pure choice, tested over every device, memory, model size and flag combination."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.engine.sizing import (
    CPU_SIZES,
    GIB,
    DeviceFacts,
    SizeFlags,
    choose_sizes,
    device_defaults,
)

kinds = st.sampled_from(["cpu", "metal", "cuda"])
memory = st.integers(min_value=0, max_value=2048 * GIB)
model_bytes = st.none() | st.integers(min_value=0, max_value=1024 * GIB)
flag = st.none() | st.integers(min_value=1, max_value=1 << 20)
facts = st.builds(DeviceFacts, kinds, memory, model_bytes)
flags = st.builds(SizeFlags, flag, flag, flag)


def _values(flags_: SizeFlags, facts_: DeviceFacts) -> tuple[int, int, int]:
    sizes = choose_sizes(flags_, facts_)
    return sizes.prefill_step_size, sizes.completion_batch_size, sizes.prefill_batch_size


@given(flags, facts)
def test_a_flag_wins_and_is_named_as_the_source(given_: SizeFlags, device: DeviceFacts) -> None:
    sizes = choose_sizes(given_, device)
    defaults = device_defaults(device)[:3]
    wanted = (given_.prefill_step_size, given_.completion_batch_size, given_.prefill_batch_size)
    chosen = _values(given_, device)
    for value, flagged, default, source in zip(
        chosen, wanted, defaults, sizes.sources, strict=True
    ):
        assert value == (default if flagged is None else flagged)
        assert source == ("device default" if flagged is None else "flag")
        assert value >= 1
    line = sizes.describe()
    assert line.startswith(f"sizes: prefill step {chosen[0]}, decode batch {chosen[1]}")
    assert f"({device.kind}: " in line
    if all(w is None for w in wanted):
        assert line.endswith("; no flag set)")
    if given_.prefill_step_size is not None:
        assert "--prefill-step-size" in line
    shown = sizes.to_json()
    assert shown["prefill_step_size"] == {
        "value": chosen[0],
        "source": sizes.sources[0],
        "flag": "--prefill-step-size",
    }
    assert shown["decode_batch_size"]["value"] == chosen[1]
    assert shown["device"] == device.kind


@given(memory, model_bytes)
def test_the_cpu_keeps_the_cancel_friendly_sizes(total: int, weights: int | None) -> None:
    assert _values(SizeFlags(), DeviceFacts("cpu", total, weights)) == CPU_SIZES


@given(kinds, memory, memory, model_bytes)
def test_more_memory_never_gives_smaller_sizes(
    kind: str, a: int, b: int, weights: int | None
) -> None:
    small, large = sorted((a, b))
    low = _values(SizeFlags(), DeviceFacts(kind, small, weights))  # type: ignore[arg-type]
    high = _values(SizeFlags(), DeviceFacts(kind, large, weights))  # type: ignore[arg-type]
    assert all(x <= y for x, y in zip(low, high, strict=True))


@given(kinds, memory, st.integers(0, 1024 * GIB), st.integers(0, 1024 * GIB))
def test_a_larger_model_never_gives_larger_sizes(kind: str, total: int, a: int, b: int) -> None:
    lighter, heavier = sorted((a, b))
    light = _values(SizeFlags(), DeviceFacts(kind, total, lighter))  # type: ignore[arg-type]
    heavy = _values(SizeFlags(), DeviceFacts(kind, total, heavier))  # type: ignore[arg-type]
    assert all(x >= y for x, y in zip(light, heavy, strict=True))


def test_the_measured_gpu_choices() -> None:
    # An H200 (~141 GB) with a 4B bf16 model (~8.8 GB): long chunks, a wide decode batch.
    h200 = DeviceFacts("cuda", 141 * GIB, 9 * GIB)
    assert _values(SizeFlags(), h200) == (2048, 64, 8)
    line = choose_sizes(SizeFlags(), h200).describe()
    assert line.startswith("sizes: prefill step 2048, decode batch 64, prompt batch 8 (cuda: ")
    # A 32 GB Mac with the same model: long chunks, mlx-lm's decode batch.
    assert _values(SizeFlags(), DeviceFacts("metal", 32 * GIB, 9 * GIB)) == (2048, 32, 8)
    # A GPU with little room left after the weights: shorter chunks, smaller batches.
    assert _values(SizeFlags(), DeviceFacts("cuda", 16 * GIB, 12 * GIB)) == (1024, 16, 4)
    # A flag set on the H200: only that size changes, and the line names the flag.
    flagged = choose_sizes(SizeFlags(prefill_step_size=512), h200)
    assert (flagged.prefill_step_size, flagged.completion_batch_size) == (512, 64)
    assert flagged.describe().endswith("; --prefill-step-size set)")
