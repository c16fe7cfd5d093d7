"""The bench model (``bench/make_bench_model.py``: 10M random parameters, 4 layers, 8 heads)
split over 2 ranks, by tensors and by layers, writes exactly what one process writes (issue
26). Random weights leave the logits close together, so greedy text is a fine probe of
numerics: a split that summed in another order or paired the wrong exchanges would show.
The model is used in mlx-lm's qwen2 class (``tests/sharded.qwen2_copy``), which splits both
ways; each configuration answers the same prompts one at a time.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2 as httpx
import pytest

from .conftest import MODEL
from .sharded import Ranks, qwen2_copy, start_ranks, start_single

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 120
PROMPTS = ["Write a story.", "Reply with: hello", "What is the capital of France?"]
TOKENS = 32


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "make_bench_model.py"), "--no-check"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    source = Path(made.stdout.split(" (")[0].strip())
    return qwen2_copy(tmp_path_factory.mktemp("bench-qwen2"), source)


def answers(start: Callable[[], Ranks]) -> list[str]:
    ranks = start()
    try:
        texts = []
        for prompt in PROMPTS:
            body = {"model": MODEL, "input": prompt, "temperature": 0, "max_output_tokens": TOKENS}
            data = httpx.post(f"{ranks.base_url}/v1/responses", json=body, timeout=DEADLINE)
            answer = data.json()
            assert answer["usage"]["output_tokens"] == TOKENS  # no end token: all are written
            texts.append(answer["output"][-1]["content"][0]["text"])
        codes = ranks.stop(DEADLINE)
    finally:
        ranks.close()
    assert set(codes) == {0}, ranks.log(0)
    return texts


def test_tensor_and_pipeline_write_what_one_process_writes(model: Path, tmp_path: Path) -> None:
    alias = ("--alias", MODEL)
    single = answers(lambda: start_single(model, tmp_path, *alias))
    tensor = answers(lambda: start_ranks(model, tmp_path, *alias))
    pipeline = answers(lambda: start_ranks(model, tmp_path, *alias, "--pipeline"))
    assert tensor == single
    assert pipeline == single
