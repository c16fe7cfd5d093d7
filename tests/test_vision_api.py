"""Images through HTTP on a vision-language model: the tiny Qwen2-VL fixture
(``tests/fixtures/vision/qwen2-vl``, docs/vision.md) served for real, asked through the
``openai`` SDK.

Every test starts the real server on the fixture: mlx-lm runs the language model in the batch,
mlx-vlm's processor and vision tower take the image.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import trio
from openai import AsyncOpenAI
from PIL import Image

from mlx_responses.api_keys import load_api_keys
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, output_text, server_settings, wait_until
from .test_api_prompt_cache_templates import start

DEADLINE = 120
FIXTURE = Path(__file__).parent / "fixtures" / "vision" / "qwen2-vl"
QUESTION = "What colour is the square?"
ALICE, BOB = "sk-alice", "sk-bob"
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def png(rgb: tuple[int, int, int], side: int = 84) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), rgb).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def image_message(url: str, text: str = QUESTION) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "input_image", "image_url": url, "detail": "auto"},
            {"type": "input_text", "text": text},
        ],
    }


async def test_a_data_url_image_is_answered_and_counted(nursery: trio.Nursery) -> None:
    server = await start(nursery, FIXTURE)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            models = await sdk.models.list()
            with_image = await sdk.responses.create(
                model=MODEL,
                input=[image_message(data_url(png(COLOURS["red"])))],  # type: ignore[list-item]
                temperature=0,
                max_output_tokens=8,
            )
            text_only = await sdk.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": QUESTION}],
                temperature=0,
                max_output_tokens=8,
            )
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                counted = await http.post(
                    "/v1/responses/input_tokens",
                    json={"model": MODEL, "input": [image_message(data_url(png((9, 9, 9))))]},
                )
    assert [m.model_dump().get("input_modalities") for m in models.data] == [["text", "image"]]
    assert with_image.status in ("completed", "incomplete")
    assert with_image.usage is not None
    assert text_only.usage is not None
    # An 84x84 square is 36 patches, 9 image tokens after the 2x2 merge, between vision marks.
    extra = with_image.usage.input_tokens - text_only.usage.input_tokens
    assert extra == 9 + 2, (with_image.usage, text_only.usage)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == with_image.usage.input_tokens


async def start_with(
    nursery: trio.Nursery, prompt_cache_bytes: int | None = None, **changes: Any
) -> ServerHandle:
    """The server on the fixture, with ``changes`` to its settings."""
    model: dict[str, Any] = {}
    if prompt_cache_bytes is not None:
        model["prompt_cache_bytes"] = prompt_cache_bytes
    settings = server_settings(**model)
    settings = dataclasses.replace(
        settings,
        model=dataclasses.replace(settings.model, model_path=str(FIXTURE)),
        **changes,
    )
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    return server


def first_text(response: Any) -> str:
    return str(response.output_text)


async def test_every_route_an_image_arrives_by_reaches_the_model(nursery: trio.Nursery) -> None:
    """A file id, a tool's output (Codex's view_image), a previous_response_id chain and a
    conversation each carry the image: each answers as the same image sent inline does."""
    server = await start(nursery, FIXTURE)
    red = png(COLOURS["red"])
    ask: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 8}
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            inline = await sdk.responses.create(input=[image_message(data_url(red))], **ask)
            uploaded = await sdk.files.create(file=("red.png", red, "image/png"), purpose="vision")
            by_file = await sdk.responses.create(
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "file_id": uploaded.id, "detail": "auto"},
                            {"type": "input_text", "text": QUESTION},
                        ],
                    }
                ],
                **ask,
            )
            # The image as a tool's output, then the same question on the next turn.
            tool_turn = await sdk.responses.create(
                input=[
                    {"role": "user", "content": "Look at the picture."},
                    {
                        "type": "function_call",
                        "call_id": "call_1",
                        "name": "view_image",
                        "arguments": '{"path": "red.png"}',
                    },
                    {
                        "type": "function_call_output",
                        "call_id": "call_1",
                        "output": [{"type": "input_image", "image_url": data_url(red)}],
                    },
                    {"role": "user", "content": QUESTION},
                ],
                **ask,
            )
            first = await sdk.responses.create(input=[image_message(data_url(red))], **ask)
            chained = await sdk.responses.create(
                previous_response_id=first.id, input="And again: " + QUESTION, **ask
            )
            items = await sdk.responses.input_items.list(first.id)
            conversation = await sdk.conversations.create(items=[])
            in_conversation = await sdk.responses.create(
                conversation=conversation.id, input=[image_message(data_url(red))], **ask
            )
            next_in_conversation = await sdk.responses.create(
                conversation=conversation.id, input="And again: " + QUESTION, **ask
            )
    assert first_text(inline) == "red"
    assert first_text(by_file) == first_text(inline)
    assert by_file.usage is not None
    assert inline.usage is not None
    assert by_file.usage.input_tokens == inline.usage.input_tokens
    assert tool_turn.status in ("completed", "incomplete")
    assert tool_turn.usage is not None
    assert tool_turn.usage.input_tokens > inline.usage.input_tokens  # the image is in the prompt
    # The chain replays the stored image: the prompt holds it (the first turn's tokens and more).
    assert chained.usage is not None
    assert chained.usage.input_tokens > inline.usage.input_tokens
    assert chained.usage.input_tokens_details.cached_tokens >= inline.usage.input_tokens - 1
    listed = items.data[0].model_dump()
    assert [part["type"] for part in listed["content"]] == ["input_image", "input_text"]
    assert listed["content"][0]["image_url"] == data_url(red)
    assert first_text(in_conversation) == first_text(inline)
    assert next_in_conversation.usage is not None
    assert next_in_conversation.usage.input_tokens > inline.usage.input_tokens


async def test_conversation_items_take_images_as_a_responses_input_does(
    nursery: trio.Nursery,
) -> None:
    """An image added to a conversation directly (``POST /v1/conversations`` and its
    ``/items``, by data URL or file id) is checked as a response's, listed as its
    ``input_image``, and seen by the model when a response continues the conversation; a bad
    one is a 400 naming it and adds nothing."""
    server = await start(nursery, FIXTURE)
    green, blue = png(COLOURS["green"]), png(COLOURS["blue"])
    ask: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 8}
    again = "And again: " + QUESTION
    async with (
        AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as http,
    ):
        with trio.fail_after(DEADLINE):
            # The same two turns as a response with the image and its answer would leave.
            by_url = await sdk.conversations.create(
                items=[
                    image_message(data_url(green)),  # type: ignore[list-item]
                    {"role": "assistant", "content": "green"},
                ]
            )
            uploaded = await sdk.files.create(file=("b.png", blue, "image/png"), purpose="vision")
            by_file = await sdk.conversations.create(items=[])
            await sdk.conversations.items.create(
                by_file.id,
                items=[
                    {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_image", "file_id": uploaded.id, "detail": "auto"},
                            {"type": "input_text", "text": QUESTION},
                        ],
                    },
                    {"type": "message", "role": "assistant", "content": "blue"},
                ],
            )
            listed = await sdk.conversations.items.list(by_file.id, order="asc")
            refused = await http.post(
                f"/v1/conversations/{by_file.id}/items",
                json={"items": [image_message("data:image/png;base64,aGVsbG8gd29ybGQ=")]},
            )
            after_refusal = await sdk.conversations.items.list(by_file.id)
            continued_green = await sdk.responses.create(conversation=by_url.id, input=again, **ask)
            continued_blue = await sdk.responses.create(conversation=by_file.id, input=again, **ask)
    user = listed.data[0].model_dump()
    assert [part["type"] for part in user["content"]] == ["input_image", "input_text"]
    assert user["content"][0]["image_url"] == data_url(blue)  # the file, as its data URL
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "items[0].content[0].image_url"
    assert len(after_refusal.data) == 2
    assert first_text(continued_green) == "green"
    assert first_text(continued_blue) == "blue"


async def test_bad_images_are_refused_naming_the_part_and_nothing_is_stored(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, FIXTURE)
    huge = io.BytesIO()
    Image.new("1", (8000, 6000)).save(huge, "PNG")  # 48M pixels, a small file
    cases = {
        "data:image/png;base64,aGVsbG8gd29ybGQ=": "input[0].content[0].image_url",  # not an image
        "data:image/png;base64,!!!": "input[0].content[0].image_url",
        data_url(huge.getvalue()): "input[0].content[0].image_url",
        "https://example.com/red.png": "input[0].content[0].image_url",
    }
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            refused = {
                url: await http.post(
                    "/v1/responses", json={"model": MODEL, "input": [image_message(url)]}
                )
                for url in cases
            }
            missing_file = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": [
                        {"role": "user", "content": [{"type": "input_image", "file_id": "file-x"}]}
                    ],
                },
            )
            bad_detail = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": [
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "input_image",
                                    "image_url": data_url(png((1, 2, 3))),
                                    "detail": "huge",
                                }
                            ],
                        }
                    ],
                },
            )
            health = (await http.get("/health")).json()
    for url, param in cases.items():
        reply = refused[url]
        assert reply.status_code == 400, (url[:40], reply.text)
        assert reply.json()["error"]["param"] == param
    message = refused["data:image/png;base64,aGVsbG8gd29ybGQ="].json()["error"]["message"]
    assert "not an image this server can decode" in message
    assert " object at 0x" not in message  # no internal object in what the client reads
    assert missing_file.status_code == 400
    assert missing_file.json()["error"]["param"] == "input[0].content[0].file_id"
    assert bad_detail.status_code == 400
    assert bad_detail.json()["error"]["param"] == "input[0].content[0].detail"
    # Refused before any model work: nothing was prefilled, nothing generated or stored.
    assert server.model.statistics().prompt_tokens_processed == 0
    assert health["batch"]["sequences_finished"] == 0, health["batch"]


async def test_anthropic_messages_take_image_blocks(nursery: trio.Nursery) -> None:
    server = await start(nursery, FIXTURE)
    red = base64.b64encode(png(COLOURS["red"])).decode("ascii")
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": red}}
    async with anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key="x", max_retries=0, timeout=60
    ) as sdk:
        async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x") as openai_sdk:
            with trio.fail_after(DEADLINE):
                message = await sdk.messages.create(
                    model=MODEL,
                    max_tokens=8,
                    extra_body={"temperature": 0},
                    messages=[
                        {"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}  # type: ignore[list-item]
                    ],
                )
                counted = await sdk.messages.count_tokens(
                    model=MODEL,
                    messages=[
                        {"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}  # type: ignore[list-item]
                    ],
                )
                responses = await openai_sdk.responses.create(
                    model=MODEL,
                    input=[image_message(data_url(png(COLOURS["red"])))],  # type: ignore[list-item]
                    temperature=0,
                    max_output_tokens=8,
                )
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text == responses.output_text == "red"
    assert responses.usage is not None
    assert message.usage.input_tokens == counted.input_tokens == responses.usage.input_tokens


async def test_image_and_text_requests_batch_together_each_as_alone(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, FIXTURE)
    asks: list[list[dict[str, Any]] | str] = [
        [image_message(data_url(png(COLOURS["red"])))],
        [image_message(data_url(png(COLOURS["blue"], side=112)))],
        # Long text answers (the trained count), so the image requests join a batch that is
        # still decoding however the machine schedules their image processing.
        "Count from 1 to 20.",
        "Reply with: hello",
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:

        async def run(ask: list[dict[str, Any]] | str) -> str:
            body = {"model": MODEL, "input": ask, "temperature": 0, "max_output_tokens": 64}
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            return output_text(reply.json())

        with trio.fail_after(DEADLINE):
            solo = [await run(ask) for ask in asks]
            together: list[str | None] = [None] * len(asks)

            async def one(i: int) -> None:
                together[i] = await run(asks[i])

            async with trio.open_nursery() as n:
                for i in range(len(asks)):
                    n.start_soon(one, i)
    assert together == solo
    stats = server.model.statistics()
    assert stats.active == 0
    assert stats.peak_decoding >= 2  # they shared the batch


async def test_a_cancelled_image_request_leaves_the_batch_empty(nursery: trio.Nursery) -> None:
    server = await start(nursery, FIXTURE)
    model = server.model
    # A schema that forces a long answer, so the request is still decoding when cancelled.
    long_text = {
        "type": "json_schema",
        "name": "long",
        "schema": {
            "type": "object",
            "properties": {"a": {"type": "string", "minLength": 4000}},
            "required": ["a"],
            "additionalProperties": False,
        },
        "strict": True,
    }
    body = {
        "model": MODEL,
        "input": [image_message(data_url(png(COLOURS["green"])))],
        "background": True,
        "max_output_tokens": 3000,
        "text": {"format": long_text},
    }
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            started = (await http.post("/v1/responses", json=body)).json()
            await wait_until(lambda: model.statistics().tokens_generated > 5)
            cancelled = await http.post(f"/v1/responses/{started['id']}/cancel")
            await model.wait_idle()
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    stats = model.statistics()
    assert stats.sequences_cancelled == 1
    assert stats.active == 0


async def test_the_prompt_cache_keys_images_by_their_pixels(nursery: trio.Nursery) -> None:
    """A replay with the same image is served from the cache past the image; the same text
    with another image is not (it shares only the text before the image) and answers as that
    image alone does. Another tenant's identical replay is not served from the first's."""
    server = await start_with(nursery, api_keys=load_api_keys([ALICE, BOB]))
    cold = await start_with(nursery, prompt_cache_bytes=0)

    async def create(base_url: str, history: list[dict[str, Any]], key: str = "") -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            reply = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": history,
                    "temperature": 0,
                    "max_output_tokens": 8,
                    "store": False,
                },
                headers={"Authorization": f"Bearer {key}"} if key else {},
            )
        assert reply.status_code == 200, reply.text
        data: dict[str, Any] = reply.json()
        return data

    red, blue = data_url(png(COLOURS["red"])), data_url(png(COLOURS["blue"]))
    with trio.fail_after(DEADLINE):
        first = await create(server.base_url, [image_message(red)], ALICE)
        replay = [image_message(red), *first["output"], {"role": "user", "content": QUESTION}]
        again = await create(server.base_url, replay, ALICE)
        elsewhere = await create(server.base_url, replay, BOB)
        other = await create(server.base_url, [image_message(blue)], ALICE)
        other_cold = await create(cold.base_url, [image_message(blue)])
    image_end = first["usage"]["input_tokens"] - 20  # well past the image's 11 tokens
    assert again["usage"]["input_tokens_details"]["cached_tokens"] > image_end
    assert elsewhere["usage"]["input_tokens_details"]["cached_tokens"] == 0
    # The blue square shares the system prompt and the user turn's opening, not the image.
    shared = other["usage"]["input_tokens_details"]["cached_tokens"]
    assert shared < first["usage"]["input_tokens"] - 20, other["usage"]
    assert output_text(other) == output_text(other_cold) == "blue"


async def test_image_urls_are_fetched_only_when_allowed_and_detail_low_costs_less(
    nursery: trio.Nursery,
) -> None:
    server = await start_with(nursery, fetch_image_urls=True)
    big = png((200, 30, 30), side=560)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:

        async def count(part: dict[str, Any]) -> int:
            reply = await http.post(
                "/v1/responses/input_tokens",
                json={"model": MODEL, "input": [{"role": "user", "content": [part]}]},
            )
            assert reply.status_code == 200, reply.text
            return int(reply.json()["input_tokens"])

        with trio.fail_after(DEADLINE):
            uploaded = (
                await http.post(
                    "/v1/files",
                    files={"file": ("big.png", big, "image/png")},
                    data={"purpose": "vision"},
                )
            ).json()
            # The server's own file content route stands in for a web server.
            url = f"{server.base_url}/v1/files/{uploaded['id']}/content"
            fetched = await count({"type": "input_image", "image_url": url})
            inline = await count({"type": "input_image", "image_url": data_url(big)})
            low = await count({"type": "input_image", "image_url": data_url(big), "detail": "low"})
            unreachable = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": [image_message("http://127.0.0.1:9/nothing.png")],
                },
            )
    assert fetched == inline
    assert low < inline  # "low" caps the processor's pixel budget: fewer image tokens
    assert unreachable.status_code == 400
    assert unreachable.json()["error"]["param"] == "input[0].content[0].image_url"


def documented_images() -> list[dict[str, Any]]:
    records = json.loads((FIXTURE / "prompts.json").read_text(encoding="utf-8"))
    return [r for r in records if r.get("image") and r["expected"] in COLOURS]


def documented_input(record: dict[str, Any], image: dict[str, Any]) -> list[dict[str, Any]]:
    """The documented conversation as Responses input, ``image`` where its ``{"type": "image"}``
    part is: a tool call as a ``function_call`` item, a tool turn as its output's parts."""
    items: list[dict[str, Any]] = []
    for message in record["messages"]:
        content = message["content"]
        if isinstance(content, list):
            content = [
                image if part["type"] == "image" else {"type": "input_text", "text": part["text"]}
                for part in content
            ]
        for call in message.get("tool_calls", []):
            function = call["function"]
            arguments = json.dumps(function["arguments"])
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": arguments,
                }
            )
        if message["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": content,
                }
            )
        elif content:
            items.append({"role": message["role"], "content": content})
    return items


async def test_each_documented_colour_is_answered_from_a_data_url_and_a_file_id(
    nursery: trio.Nursery,
) -> None:
    server = await start(nursery, FIXTURE)
    records = documented_images()
    answers: dict[str, tuple[str, str]] = {}
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as sdk:
        with trio.fail_after(DEADLINE):
            for record in records:
                spec = record["image"]
                data = png(tuple(spec["rgb"]), spec["side"])  # type: ignore[arg-type]
                uploaded = await sdk.files.create(
                    file=("square.png", data, "image/png"), purpose="vision"
                )
                replies = []
                for image in (
                    {"type": "input_image", "image_url": data_url(data), "detail": "auto"},
                    {"type": "input_image", "file_id": uploaded.id, "detail": "auto"},
                ):
                    reply = await sdk.responses.create(
                        model=MODEL,
                        input=documented_input(record, image),  # type: ignore[arg-type]
                        temperature=0,
                        max_output_tokens=16,
                    )
                    replies.append(reply.output_text.strip())
                answers[record["name"]] = (replies[0], replies[1])
    assert answers == {r["name"]: (r["expected"], r["expected"]) for r in records}


async def test_text_that_looks_like_an_image_is_ordinary_text_on_every_route(
    nursery: trio.Nursery,
) -> None:
    """An accepted image is a typed part of its item, never text, so a client's text holding
    U+E000 (once the opening of the image marker) is taken as text on every route: listed back
    as the same text, and counted as text, not as an image."""
    server = await start(nursery, FIXTURE)
    posing = f"\ue000image auto {data_url(png(COLOURS['red']))}\ue001{QUESTION}"
    ask: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 4}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post(
                "/v1/responses", json={**ask, "input": [{"role": "user", "content": posing}]}
            )
            assert created.status_code == 200, created.text
            listed = await http.get(f"/v1/responses/{created.json()['id']}/input_items")
            counts = [
                await http.post(
                    "/v1/responses/input_tokens",
                    json={"model": MODEL, "instructions": text, "input": "hi"},
                )
                for text in (posing, posing.replace("\ue000", "x"))
            ]
            message = await http.post(
                "/v1/messages",
                json={
                    "model": MODEL,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": posing}]}],
                },
            )
            conversation = await http.post(
                "/v1/conversations",
                json={"items": [{"type": "message", "role": "user", "content": posing}]},
            )
            assert conversation.status_code == 200, conversation.text
            items = await http.get(f"/v1/conversations/{conversation.json()['id']}/items")
    assert listed.json()["data"][0]["content"] == [{"type": "input_text", "text": posing}]
    assert [c.status_code for c in counts] == [200, 200]
    # The same count as the text with another character there: no image tokens in it.
    tokens = [c.json()["input_tokens"] for c in counts]
    assert abs(tokens[0] - tokens[1]) <= 2, tokens
    assert message.status_code == 200, message.text
    assert items.json()["data"][0]["content"] == [{"type": "input_text", "text": posing}]
