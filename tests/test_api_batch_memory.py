"""What the batch holds and how it is sized, as an operator sees it through the real server:
the running batch's KV bytes and the prompt cache's entries and bytes in ``/status``,
``/metrics`` and ``/health``; the batch's sizes (a flag's, else the device's) in ``/status``
and ``/metrics``; the start-up line of the real command."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, server_settings, wait_until
from .rawhttp import open_stream, read_until
from .test_cli_operations import cli
from .test_metrics import scrape, value
from .test_status_page import SlowSteps

DEADLINE = 120
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0, "max_output_tokens": 8}
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0, "stream": True}


async def start(nursery: trio.Nursery, **model: Any) -> ServerHandle:
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, server_settings(**model))
    return handle


async def status(http: httpx.AsyncClient, base: str) -> dict[str, Any]:
    reply = await http.get(f"{base}/status")
    assert reply.status_code == 200, reply.text
    view: dict[str, Any] = reply.json()
    return view


async def test_a_finished_request_leaves_a_cache_entry_and_an_empty_batch(
    server: ServerHandle,
) -> None:
    base = server.base_url
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            before = await status(http, base)
            assert before["prompt_cache"]["entries"] == 0
            assert before["prompt_cache"]["bytes"] == 0
            done = await http.post(f"{base}/v1/responses", json=HELLO)
            assert done.status_code == 200, done.text
            await server.model.wait_idle()
            view = await status(http, base)
            samples, kinds = await scrape(http, base)
            health = (await http.get(f"{base}/health")).json()
    cache = view["prompt_cache"]
    assert cache["entries"] == 1
    assert cache["bytes"] > 0
    assert cache["misses"] == 1
    assert view["batch"]["kv_bytes"] == 0
    assert health["batch"]["kv_bytes"] == 0
    assert value(samples, "mlx_responses_prompt_cache_entries") == 1
    assert value(samples, "mlx_responses_prompt_cache_bytes") == cache["bytes"]
    assert value(samples, "mlx_responses_prompt_cache_misses_total") == 1
    assert value(samples, "mlx_responses_batch_kv_bytes") == 0
    assert kinds["mlx_responses_batch_kv_bytes"] == "gauge"


async def test_a_decoding_stream_holds_kv_bytes_until_it_is_cancelled(
    nursery: trio.Nursery,
) -> None:
    steps = SlowSteps(0.05)
    handle = await start(nursery, thread_factory=steps.factory)
    base, model = handle.base_url, handle.model
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            async with await open_stream(base, "/v1/responses", COUNT) as stream:
                await read_until(stream, b"event: response.output_text.delta", count=2)
                view = await status(http, base)
                samples, _ = await scrape(http, base)
                health = (await http.get(f"{base}/health")).json()
                # Still decoding: the answer counts to 110, a step at least 50 ms apart.
                assert model.statistics().decoding == 1
            # The client hung up: its sequence leaves the batch, and its KV bytes with it.
            await model.wait_idle()
            await wait_until(lambda: model.statistics().batch_kv_bytes == 0)
            after = await status(http, base)
            samples_after, _ = await scrape(http, base)
    held = view["batch"]["kv_bytes"]
    assert view["batch"]["decoding"] == 1
    assert held > 0
    assert value(samples, "mlx_responses_batch_kv_bytes") > 0
    assert health["batch"]["kv_bytes"] > 0
    assert model.statistics().sequences_cancelled == 1
    assert after["batch"]["kv_bytes"] == 0
    assert value(samples_after, "mlx_responses_batch_kv_bytes") == 0


def _size_samples(samples: dict[Any, float]) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["size"], dict(labels)["source"]): v
        for (name, labels), v in samples.items()
        if name == "mlx_responses_batch_size_limit"
    }


async def test_the_sizes_and_their_sources_are_shown(nursery: trio.Nursery) -> None:
    plain = await start(nursery)
    flagged = await start(nursery, prefill_step_size=4)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            by_device = (await status(http, plain.base_url))["server"]["sizes"]
            by_flag = await status(http, flagged.base_url)
            device_samples, _ = await scrape(http, plain.base_url)
            flag_samples, _ = await scrape(http, flagged.base_url)
    assert by_device["device"] == "cpu"  # the test machine's MLX runs on its CPU
    for name, wanted in (
        ("prefill_step_size", 512),
        ("decode_batch_size", 32),
        ("prompt_batch_size", 8),
    ):
        assert by_device[name]["value"] == wanted
        assert by_device[name]["source"] == "device default"
    sizes = by_flag["server"]["sizes"]
    assert sizes["prefill_step_size"] == {
        "value": 4,
        "source": "flag",
        "flag": "--prefill-step-size",
    }
    assert sizes["decode_batch_size"]["source"] == "device default"
    assert by_flag["batch"]["capacity"] == sizes["decode_batch_size"]["value"]
    assert by_flag["server"]["flags"]["--prefill-step-size"] == 4
    assert _size_samples(device_samples) == {
        ("prefill_step", "device default"): 512,
        ("decode_batch", "device default"): 32,
        ("prompt_batch", "device default"): 8,
    }
    assert _size_samples(flag_samples)[("prefill_step", "flag")] == 4


def test_the_start_up_line_says_which_sizes_and_why() -> None:
    plain = cli("serve", "--check")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert (
        "sizes: prefill step 512, decode batch 32, prompt batch 8 (cpu: a cancel during "
        "prefill waits at most one short chunk; no flag set)"
    ) in plain.stderr
    flagged = cli("serve", "--check", "--prefill-step-size", "64")
    assert flagged.returncode == 0, flagged.stdout + flagged.stderr
    assert "sizes: prefill step 64, decode batch 32, prompt batch 8 (cpu: " in flagged.stderr
    assert "; --prefill-step-size set)" in flagged.stderr
    # The flag's environment variable is the flag.
    env = cli("serve", "--check", env={"MLX_RESPONSES_DECODE_CONCURRENCY": "4"})
    assert env.returncode == 0, env.stdout + env.stderr
    assert "decode batch 4, prompt batch 8 (cpu: " in env.stderr
    assert "; --decode-concurrency set)" in env.stderr
