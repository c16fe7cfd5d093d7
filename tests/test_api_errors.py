"""Refused requests: OpenAI's envelope, a message naming the field, nothing stored, still serving."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.server import ServerHandle

from .conftest import MODEL

DEADLINE = 30

CASES: list[tuple[str, Any, int, str | None, str | None]] = [
    # (name, body, status, param, code)
    ("not an object", [1, 2], 400, None, None),
    ("missing model", {"input": "hi"}, 400, "model", None),
    ("unknown model", {"model": "gpt-9", "input": "hi"}, 404, "model", "model_not_found"),
    ("model not a string", {"model": 3, "input": "hi"}, 400, "model", None),
    ("missing input", {"model": MODEL}, 400, "input", None),
    ("empty string input", {"model": MODEL, "input": ""}, 400, "input", None),
    ("empty array input", {"model": MODEL, "input": []}, 400, "input", None),
    ("input a number", {"model": MODEL, "input": 5}, 400, "input", None),
    (
        "bad role",
        {"model": MODEL, "input": [{"role": "wizard", "content": "hi"}]},
        400,
        "input[0].role",
        None,
    ),
    (
        "bad content part",
        {"model": MODEL, "input": [{"role": "user", "content": [{"type": "bogus"}]}]},
        400,
        "input[0].content[0].type",
        None,
    ),
    (
        "max_output_tokens zero",
        {"model": MODEL, "input": "hi", "max_output_tokens": 0},
        400,
        "max_output_tokens",
        None,
    ),
    (
        "max_output_tokens string",
        {"model": MODEL, "input": "hi", "max_output_tokens": "9"},
        400,
        "max_output_tokens",
        None,
    ),
    (
        "temperature too high",
        {"model": MODEL, "input": "hi", "temperature": 3},
        400,
        "temperature",
        None,
    ),
    ("stream not bool", {"model": MODEL, "input": "hi", "stream": "yes"}, 400, "stream", None),
    ("unknown field", {"model": MODEL, "input": "hi", "bogus_field": 1}, 400, "bogus_field", None),
    (
        "truncation auto",
        {"model": MODEL, "input": "hi", "truncation": "auto"},
        400,
        "truncation",
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "status", "param", "code"), CASES, ids=[c[0] for c in CASES]
)
async def test_refused_request_has_envelope_and_changes_nothing(
    server: ServerHandle, name: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            before = server.store.statistics().entries
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == status, reply.text
            error = reply.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["param"] == param
            assert error["code"] == code
            assert error["type"] == "invalid_request_error"
            if param is not None:
                assert param.split("[")[0].split(".")[0] in error["message"]
            assert server.store.statistics().entries == before
            assert server.model.statistics().active == 0
            # ... and the server keeps serving.
            ok = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}
            )
            assert ok.status_code == 200


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"model": "a", "model": "b", "input": "x"}', b'{"model": NaN}', b"", b"\xff\xfe"],
    ids=["truncated", "duplicate key", "NaN", "empty", "not utf-8"],
)
async def test_malformed_json_is_400(server: ServerHandle, raw: bytes) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(
                "/v1/responses", content=raw, headers={"content-type": "application/json"}
            )
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_route_and_unknown_response_are_enveloped_404(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            route = await http.get("/v1/nothing-here")
            missing = await http.get("/v1/responses/resp_does_not_exist")
    assert route.status_code == 404
    assert "error" in route.json()
    assert missing.status_code == 404
    assert "resp_does_not_exist" in missing.json()["error"]["message"]
