"""The chat template is compiled when the model's text side is built, at start, not in the
first request's render (``prompt_maker.warm_up_template``), and a template that refuses the
warm-up's chat does not stop a start."""

from __future__ import annotations

from typing import Any

import pytest
from transformers.utils import chat_template_utils

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.loader import LoadedModel, load_model
from mlx_responses.text.prompt_maker import ModelInfo, PromptMaker, warm_up_template


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(BUNDLED_MODEL_PATH)


def _info(loaded: LoadedModel) -> ModelInfo:
    return ModelInfo("tiny", loaded.path, loaded.context_window, "none", False, ("text",))


def _compiled() -> int:
    """How many templates Jinja compiled so far (transformers keeps them per source)."""
    return int(chat_template_utils._compile_jinja_template.cache_info().misses)


async def test_the_first_request_renders_with_the_template_compiled_at_start(
    loaded: LoadedModel,
) -> None:
    chat_template_utils._compile_jinja_template.cache_clear()
    maker = PromptMaker(_info(loaded), loaded)
    assert _compiled() == 1  # compiled while the server starts
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    ids = await maker.render(chat)
    assert ids
    assert _compiled() == 1  # the first request's render compiled nothing
    # The warm-up left no trace on what a request renders.
    again = PromptMaker(_info(loaded), loaded)
    assert await again.render(chat) == ids


class _Refusing:
    """A tokenizer whose template raises on every chat (as some do on a chat they dislike)."""

    def apply_chat_template(self, *_args: Any, **_kwargs: Any) -> list[int]:
        raise ValueError("this template wants a system message first")


def test_a_template_that_refuses_the_warm_up_chat_does_not_stop_the_start() -> None:
    assert warm_up_template(_Refusing()) is False


def test_the_warm_up_reports_a_rendered_template(loaded: LoadedModel) -> None:
    assert warm_up_template(loaded.tokenizer) is True
