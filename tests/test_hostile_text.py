"""Text validated once at the edge: a lone surrogate anywhere in a JSON body is a 400 naming
the field, streamed or not, on every JSON route, and it creates nothing."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.protocol.text import find_unencodable
from mlx_responses.server import ServerHandle

from .conftest import MODEL

DEADLINE = 30
BAD = "ok\ud800"  # json.dumps writes it as the escape "\ud800"


def state(server: ServerHandle) -> tuple[int, ...]:
    return (
        server.store.statistics().entries,
        server.conversations.statistics().entries,
        server.files.statistics().entries,
        server.responses.statistics().jobs_started,
        server.model.statistics().sequences_finished,
    )


def raw_json(body: Any) -> bytes:
    # ensure_ascii keeps the surrogate as a JSON escape, as a hostile client would send it.
    return json.dumps(body, ensure_ascii=True).encode()


FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("user", {"user": BAD}, "user"),
    ("safety_identifier", {"safety_identifier": BAD}, "safety_identifier"),
    ("prompt_cache_key", {"prompt_cache_key": BAD}, "prompt_cache_key"),
    ("metadata value", {"metadata": {"k": BAD}}, "metadata.k"),
    ("metadata key", {"metadata": {BAD: "v"}}, "metadata"),
    ("model", {"model": BAD}, "model"),
    ("instructions", {"instructions": BAD}, "instructions"),
    (
        "nested input text",
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "fine"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "fine"},
                        {"type": "input_text", "text": BAD},
                    ],
                },
            ]
        },
        "input[1].content[1].text",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("name", "extra", "param"), FIELDS, ids=[f[0] for f in FIELDS])
async def test_surrogate_in_a_response_field_is_400_and_changes_nothing(
    server: ServerHandle, name: str, extra: dict[str, Any], param: str, stream: bool
) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "stream": stream, **extra}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            before = state(server)
            reply = await http.post(
                "/v1/responses",
                content=raw_json(body),
                headers={"content-type": "application/json"},
            )
            assert reply.status_code == 400, reply.text
            assert reply.headers["content-type"].startswith("application/json")
            error = reply.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert error["param"] == param
            assert error["code"] == "invalid_text"
            assert "surrogate" in error["message"]
            assert state(server) == before
            ok = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
            )
            assert ok.status_code == 200


async def test_surrogate_is_refused_on_every_json_route(server: ServerHandle) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/conversations", {"metadata": {"topic": BAD}}, "metadata.topic"),
        (
            "/v1/conversations",
            {"items": [{"type": "message", "role": "user", "content": BAD}]},
            "items[0].content",
        ),
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": BAD}]},
            "messages[0].content",
        ),
        ("/v1/responses/input_tokens", {"model": MODEL, "input": BAD}, "input"),
        ("/v1/responses/compact", {"model": MODEL, "input": BAD}, "input"),
    ]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            for path, body, param in cases:
                before = state(server)
                reply = await http.post(
                    path, content=raw_json(body), headers={"content-type": "application/json"}
                )
                assert reply.status_code == 400, (path, reply.text)
                error = reply.json()["error"]
                assert "surrogate" in error["message"], path
                if path != "/v1/messages":  # the Anthropic envelope has no param
                    assert error["param"] == param, path
                assert state(server) == before, path


def test_find_unencodable_names_the_path() -> None:
    assert find_unencodable({"a": [1, "x", {"b": "\udfff"}]}) is not None
    found = find_unencodable({"a": [1, "x", {"b": "ab\udfff"}]})
    assert found is not None
    assert (found.path, found.index, found.in_key) == ("a[2].b", 2, False)
    assert find_unencodable({"a": ["é", "日本", "😀"], "ü": None}) is None
    key = find_unencodable({"m": {"\ud83d": 1}})
    assert key is not None
    assert (key.path, key.in_key) == ("m", True)
    # The message itself always encodes.
    key.message().encode("utf-8")
    top = find_unencodable("\ud800")
    assert top is not None
    assert top.path == ""
    top.message().encode("utf-8")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_json)
def test_find_unencodable_agrees_with_utf8(value: object) -> None:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        encodable = True
    except UnicodeEncodeError:
        encodable = False
    assert (find_unencodable(value) is None) == encodable
