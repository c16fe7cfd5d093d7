"""The bundled tiny model: where it lives and the prompts it is known to answer.

The folder ``bundled/`` next to this module is a complete mlx-lm model (Qwen3 architecture,
about half a million float32 parameters) rebuilt by ``scripts/build_tiny_model.py``. Its weights
memorise the documented prompts in ``bundled/prompts.json``: under greedy decoding each one
yields exactly its ``expected`` text, then ``<|im_end|>``. Any other prompt gets whatever the
weights produce. See ``docs/bundled-model.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUNDLED_MODEL_PATH: Path = Path(__file__).parent / "bundled"
BUNDLED_ALIAS = "mlx-responses-tiny"
BUNDLED_PROMPTS_PATH: Path = BUNDLED_MODEL_PATH / "prompts.json"


@dataclass(frozen=True, slots=True)
class BundledPrompt:
    """One documented prompt and its exact greedy completion.

    ``messages`` and ``tools`` are what was given to ``apply_chat_template(messages,
    tools=tools, add_generation_prompt=True)``; ``expected`` excludes the final
    ``<|im_end|>``, and ``expected_tokens`` counts its tokens (also without ``<|im_end|>``).
    """

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    expected: str
    expected_tokens: int


def _dict_list(value: object, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"{what} must be a list of objects")
    return [dict(item) for item in value]


def _prompt(raw: object, index: int) -> BundledPrompt:
    where = f"{BUNDLED_PROMPTS_PATH}[{index}]"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    name = raw.get("name")
    expected = raw.get("expected")
    expected_tokens = raw.get("expected_tokens")
    tools = raw.get("tools")
    if not isinstance(name, str):
        raise ValueError(f"{where}.name must be a string")
    if not isinstance(expected, str):
        raise ValueError(f"{where}.expected must be a string")
    if not isinstance(expected_tokens, int) or isinstance(expected_tokens, bool):
        raise ValueError(f"{where}.expected_tokens must be an integer")
    return BundledPrompt(
        name=name,
        messages=_dict_list(raw.get("messages"), f"{where}.messages"),
        tools=None if tools is None else _dict_list(tools, f"{where}.tools"),
        expected=expected,
        expected_tokens=expected_tokens,
    )


def load_bundled_prompts() -> list[BundledPrompt]:
    """The documented prompts of the bundled model, in file order (names are unique)."""
    raw = json.loads(BUNDLED_PROMPTS_PATH.read_text(encoding="utf-8"))
    if not isinstance(raw, list):
        raise ValueError(f"{BUNDLED_PROMPTS_PATH} must hold a JSON list")
    return [_prompt(item, index) for index, item in enumerate(raw)]
