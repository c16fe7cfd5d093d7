"""The warm-up at start (``engine/warm_up.py``): MLX's kernels are compiled before the server
serves, not in the first request, and the warm-up leaves nothing a user could see.

The server runs as the installed console script with a temp folder of its own, which starts
empty: MLX compiles its CPU kernels with the system's compiler and keeps them there, so what
the folder holds after start and after a request says who compiled what."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.loader import LoadedModel, load_model
from mlx_responses.engine.sizing import DeviceFacts, SizeFlags, choose_sizes
from mlx_responses.engine.warm_up import warm_up

from .conftest import MODEL
from .console import serving

DEADLINE = 120


def _kernels(temp: Path) -> set[str]:
    """The compiled kernels MLX keeps in ``temp`` (its CPU backend's cache)."""
    return {path.name for path in temp.rglob("*") if path.is_file()}


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


async def test_the_first_requests_compile_nothing_and_find_no_trace_of_the_warm_up(
    tmp_path: Path,
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(temp),  # MLX's kernel cache, empty: every kernel is compiled here
        "MLX_RESPONSES_PORT": "0",
        "MLX_RESPONSES_STORE": "memory",
    }
    with trio.fail_after(DEADLINE):
        async with serving(env) as (_, base_url):
            compiled = _kernels(temp)
            async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
                metrics = (await http.get("/metrics")).text
                # The warm-up's tokens, steps and prompt are nowhere a user looks.
                assert _metric(metrics, "mlx_responses_generated_tokens") == 0
                assert _metric(metrics, "mlx_responses_batch_steps") == 0
                assert _metric(metrics, "mlx_responses_prompt_cache_entries") == 0
                for body in (
                    {"model": MODEL, "input": "Count from 1 to 20.", "max_output_tokens": 16},
                    {"model": MODEL, "input": "Say hi.", "temperature": 0, "stream": True},
                ):
                    reply = await http.post("/v1/responses", json=body)
                    assert reply.status_code == 200, reply.text
                # Two at once: batched in the generator, prefill and decode steps.
                pair = {"model": MODEL, "input": "Count from 1 to 20.", "max_output_tokens": 16}
                replies: list[int] = []

                async def ask() -> None:
                    replies.append((await http.post("/v1/responses", json=pair)).status_code)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ask)
                    nursery.start_soon(ask)
                assert replies == [200, 200]
    assert compiled  # the start compiled the kernels ...
    assert _kernels(temp) == compiled  # ... and the first requests needed no other


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    sizes = choose_sizes(SizeFlags(), DeviceFacts("cpu"))
    return replace(load_model(BUNDLED_MODEL_PATH), sizes=sizes)


class _Refusing:
    """A tokenizer that cannot encode (a fault, to see that a failed warm-up stops nothing)."""

    def encode(self, _text: str) -> list[int]:
        raise RuntimeError("no vocabulary")


def test_a_failed_warm_up_is_reported_not_raised(loaded: LoadedModel) -> None:
    assert warm_up(replace(loaded, tokenizer=_Refusing())) is None


def test_the_warm_up_runs_on_the_loaded_model(loaded: LoadedModel) -> None:
    seconds = warm_up(loaded)
    assert seconds is not None
    assert seconds > 0
