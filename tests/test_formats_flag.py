"""``--tool-format``: overriding the detected format, refusing a bad name, and a model with no
known format (start-up line, ``/v1/models``, a forced call refused naming the flag)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio
from openai import AsyncOpenAI, BadRequestError

from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings

DEADLINE = 60
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_the_flag_names_a_format_or_auto() -> None:
    parse = build_parser({}).parse_args
    assert settings_from_args(parse(["serve", "--tool-format", "harmony"])).model.tool_format == (
        "harmony"
    )
    assert settings_from_args(
        parse(["serve", "--tool-format", "json_tools"])
    ).model.tool_format == ("hermes")
    assert settings_from_args(parse(["serve"])).model.tool_format is None


def test_a_bad_name_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["serve", "--tool-format", "nope"])
    err = capsys.readouterr().err
    assert "--tool-format" in err
    assert "'nope'" in err
    assert "hermes" in err
    with pytest.raises(SystemExit):
        build_parser({"MLX_RESPONSES_TOOL_FORMAT": "nope"}).parse_args(["serve"])
    err = capsys.readouterr().err
    assert "MLX_RESPONSES_TOOL_FORMAT" in err
    assert "--tool-format" in err


async def test_a_model_without_a_known_format_says_so_and_refuses_forced_calls(
    nursery: trio.Nursery,
) -> None:
    settings = server_settings(tool_format="none")  # the bundled model, told it has none
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    async with AsyncOpenAI(
        base_url=f"{handle.base_url}/v1", api_key="x", max_retries=0, timeout=DEADLINE
    ) as client:
        with trio.fail_after(DEADLINE):
            models = await client.models.with_raw_response.list()
            (entry,) = models.http_response.json()["data"]
            with pytest.raises(BadRequestError) as refused:
                await client.responses.create(
                    model=MODEL,
                    input="hi",
                    tools=[WEATHER],  # type: ignore[list-item]
                    tool_choice="required",
                )
            # Without a format, calls are not parsed: the text stays text.
            free = await client.responses.create(
                model=MODEL,
                input="What is the capital of France?",
                tools=[WEATHER],  # type: ignore[list-item]
                temperature=0,
            )
    assert entry["tool_call_format"] == "none"
    assert entry["supports_tools"] is False
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "tool_choice"
    assert "--tool-format" in error["message"]
    assert [item.type for item in free.output] == ["message"]


def test_tokenizer_config_names_the_format_even_one_mlx_lm_lacks(tmp_path: Path) -> None:
    """``tool_parser_type`` overrides detection; a name only this server knows (``harmony``)
    would fail mlx-lm's own load, so mlx-lm is not told it."""
    from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
    from mlx_responses.engine.loader import load_model

    def loaded_format(parser_type: str) -> str:
        folder = tmp_path / parser_type
        shutil.copytree(BUNDLED_MODEL_PATH, folder)
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({**config, "tool_parser_type": parser_type}))
        return load_model(str(folder)).tool_format

    assert loaded_format("harmony") == "harmony"
    assert loaded_format("json_tools") == "hermes"  # mlx-lm's name for it
