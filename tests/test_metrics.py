"""Issue 16: ``GET /metrics`` in Prometheus text format, read with prometheus_client's parser."""

from __future__ import annotations

import dataclasses

import httpx2 as httpx
import trio
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from mlx_responses.http.auth import load_api_keys
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings, wait_until

DEADLINE = 60
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0, "max_output_tokens": 8}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    samples: Samples = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        kinds[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, kinds


async def scrape(
    http: httpx.AsyncClient, base: str, **headers: str
) -> tuple[Samples, dict[str, str]]:
    reply = await http.get(f"{base}/metrics", headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return parse(reply.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_parse_and_move_with_real_requests(server: ServerHandle) -> None:
    base = server.base_url
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            before, kinds = await scrape(http, base)
            assert kinds["mlx_responses_http_requests"] == "counter"
            assert kinds["mlx_responses_batch_sequences"] == "gauge"
            assert kinds["mlx_responses_time_to_first_token_seconds"] == "histogram"
            assert (
                value(
                    before,
                    "mlx_responses_model_info",
                    model=MODEL,
                    context_window="2048",
                    tool_format=server.model.info.tool_format,
                    reasoning=str(server.model.info.has_thinking).lower(),
                )
                == 1
            )
            async with AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client:
                for _ in range(2):
                    done = await client.responses.create(**HELLO)
                    assert done.status == "completed"
                streamed = await client.responses.create(
                    model=MODEL, input="Count from 1 to 20.", temperature=0, stream=True
                )
                async for _event in streamed:
                    pass
            missing = await http.get(f"{base}/v1/responses/resp_nothing")
            assert missing.status_code == 404
            after, _ = await scrape(http, base)

    route = "/v1/responses"
    assert (
        value(after, "mlx_responses_http_requests_total", route=route, method="POST", status="200")
        - value(
            before, "mlx_responses_http_requests_total", route=route, method="POST", status="200"
        )
        == 3
    )
    assert (
        value(
            after,
            "mlx_responses_http_requests_total",
            route="/v1/responses/<response_id>",
            method="GET",
            status="404",
        )
        == 1
    )
    assert (
        value(
            after, "mlx_responses_http_request_duration_seconds_count", route=route, method="POST"
        )
        >= 3
    )
    assert (
        value(
            after, "mlx_responses_http_requests_total", route="/metrics", method="GET", status="200"
        )
        >= 1
    )
    generated = "mlx_responses_generated_tokens_total"
    assert value(after, generated) - value(before, generated) >= 3
    prompt = "mlx_responses_prompt_tokens_total"
    assert value(after, prompt) > value(before, prompt)
    ended = "mlx_responses_sequences_ended_total"
    assert value(after, ended, reason="finished") - value(before, ended, reason="finished") == 3
    ttft = "mlx_responses_time_to_first_token_seconds_count"
    assert value(after, ttft) - value(before, ttft) == 3
    assert value(after, "mlx_responses_decode_tokens_per_second_count") >= 1
    assert value(after, "mlx_responses_store_entries", store="responses") == 3
    assert value(after, "mlx_responses_store_bytes", store="responses") > 0
    assert value(after, "mlx_responses_batch_sequences", state="active") == 0


async def test_metrics_need_a_key_when_keys_are_set(nursery: trio.Nursery) -> None:
    settings = dataclasses.replace(server_settings(), api_keys=load_api_keys(["sk-ops"]))
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            refused = await http.get(f"{handle.base_url}/metrics")
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
            wrong = await http.get(
                f"{handle.base_url}/metrics", headers={"Authorization": "Bearer sk-nope"}
            )
            assert wrong.status_code == 401
            samples, _ = await scrape(http, handle.base_url, Authorization="Bearer sk-ops")
    # The refusals were counted as requests too.
    assert (
        value(
            samples,
            "mlx_responses_http_requests_total",
            route="/metrics",
            method="GET",
            status="401",
        )
        == 2
    )


async def test_cancellations_and_jobs_are_counted(server: ServerHandle) -> None:
    base = server.base_url
    count = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=base, timeout=DEADLINE) as http:
            body = (await http.post("/v1/responses", json={**count, "background": True})).json()
            await wait_until(lambda: server.model.statistics().tokens_generated > 5)
            during, _ = await scrape(http, base)
            cancelled = await http.post(f"/v1/responses/{body['id']}/cancel")
            assert cancelled.status_code == 200
            await server.model.wait_idle()
            await wait_until(lambda: server.responses.statistics().jobs_active == 0)
            after, _ = await scrape(http, base)
    assert value(during, "mlx_responses_background_jobs_active") == 1
    assert value(during, "mlx_responses_batch_sequences", state="active") == 1
    assert value(after, "mlx_responses_background_jobs_active") == 0
    assert value(after, "mlx_responses_background_jobs_total", status="started") == 1
    assert value(after, "mlx_responses_background_jobs_total", status="finished") == 1
    assert value(after, "mlx_responses_responses_cancelled_total", reason="cancel requested") == 1
    assert value(after, "mlx_responses_sequences_ended_total", reason="cancelled") == 1
