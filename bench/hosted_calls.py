"""The server's added time per hosted call: a web search and an MCP call as the client sees them
in the stream, beside the backend's own time for the same call measured directly in the same run.

Run::

    .venv/bin/python bench/hosted_calls.py [--runs 20] [--warmup 2]

The real server runs in this process (``serve`` with the tests' ``hosted_settings()``: the local
index over tests/fixtures/web_index, MCP to 127.0.0.1) on the trained hosted-tools fixture
(tests/fixtures/hosted_model, alias ``hosted-tiny``); the real MCP server is tests/mcp_servers.py
(the ``mcp`` package's own, streamable HTTP, in a subprocess). Each run streams the fixture's two
documented prompts at temperature 0 over raw HTTP (httpx2, SSE lines timestamped on arrival)
and checks the answers are the fixture's, and calls each backend directly with the same inputs
(before the stream on odd runs, after it on even ones):

- ``LocalIndexBackend.search("capital of France", SearchOptions())`` on an index already built
  (a backend of its own over the same folder, as the server's);
- ``mcp_client.call_tool`` of ``get_weather`` ``{"city": "Paris"}`` with the server's egress
  policy and timeout (a new connection and the protocol's negotiation per call, as the server).

Per kind, medians (min and max beside them):

- ``hosted call``: what the client sees of the call: web search
  ``response.web_search_call.searching`` -> ``response.web_search_call.completed``; MCP
  ``response.mcp_call_arguments.done`` -> ``response.mcp_call.completed``;
- ``backend``: the direct call's time;
- ``added``: the server's time besides the backend's: the hosted median minus the backend's,
  the ratio of the two, and each run's difference (median, min, max);
- ``to first delta``: ``.completed`` -> the continuation's first ``response.output_text.delta``
  (admitting and prefilling the continuation: model work, not the call's);
- ``response``: the request sent -> the terminal event.

Client, server and direct calls share this process and its Trio loop (the server's MLX work is
on its own thread), so the direct call pays the same loop as the server's; the client's reading
of the stream is in the hosted figure and not in the backend's. Machine facts, with whether
OpenBLAS was loaded, head the report; a table and one JSON line follow, and the JSON goes to
``bench/results/hosted_calls-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.mcp_servers import start_mcp_server  # noqa: E402
from tests.test_api_hosted_tools import INDEX, hosted_settings  # noqa: E402

from mlx_responses.blas import openblas_loaded  # noqa: E402
from mlx_responses.hosted.local_index import LocalIndexBackend  # noqa: E402
from mlx_responses.hosted.mcp_client import McpServer, call_tool  # noqa: E402
from mlx_responses.hosted.web_search import SearchOptions  # noqa: E402
from mlx_responses.server import ServerHandle, serve  # noqa: E402
from throughput import machine_facts  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
FIXTURE = ROOT / "tests" / "fixtures" / "hosted_model"
MODEL = "hosted-tiny"
DEADLINE = 60
SEARCH = {
    "instructions": "Answer with a web search.",
    "input": "What is the capital of France?",
    "tools": [{"type": "web_search"}],
}
SEARCH_ANSWER = "The capital of France is Paris [1]."
WEATHER_ANSWER = "It is sunny, 18C in Paris."
# Per kind: the event the call starts at, the event it ends at.
SPANS = {
    "web_search": ("response.web_search_call.searching", "response.web_search_call.completed"),
    "mcp": ("response.mcp_call_arguments.done", "response.mcp_call.completed"),
}
TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def machine() -> dict[str, Any]:
    return {**machine_facts(), "openblas_loaded": openblas_loaded()}


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """One run of one kind, in seconds."""

    hosted: float
    backend: float
    to_first_delta: float
    response: float


async def stream(http: httpx2.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    """Each event of a streamed response, as ``(arrival time, event)``; the first entry is the
    time the request was sent, with no event."""
    sent = time.perf_counter()
    events: list[Any] = [(sent, None)]
    async with http.stream("POST", url, json={**body, "stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            events.append((time.perf_counter(), event))
            if event.get("type") in TERMINAL:
                break
    return events


def measure_stream(kind: str, events: list[Any], answer: str) -> tuple[float, float, float]:
    """(hosted call, ``.completed`` -> first text delta, whole response) of one stream, after
    checking it is the fixture's: one call of ``kind``, ``answer`` as its text."""
    start, end = SPANS[kind]
    at = {}
    for stamp, event in events[1:]:
        kind_of = event["type"]
        if kind_of == "response.output_text.delta" and end not in at:
            continue  # deltas before the call (none expected) are not the continuation's
        at.setdefault(kind_of, stamp)
    final = events[-1][1]
    if final["type"] != "response.completed":
        raise RuntimeError(f"{kind}: the response ended {final['type']}: {final}")
    texts = [
        part["text"]
        for item in final["response"]["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    if texts != [answer] or start not in at or end not in at:
        raise RuntimeError(f"{kind}: not the fixture's call and answer: {final['response']}")
    first_delta = at["response.output_text.delta"]
    return at[end] - at[start], first_delta - at[end], events[-1][0] - events[0][0]


async def timed(op: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await op()
    return time.perf_counter() - start


def requests(mcp_url: str) -> dict[str, tuple[dict[str, Any], str]]:
    """Per kind: the request body (the fixture's documented prompt) and the answer it gives."""
    tool = {
        "type": "mcp",
        "server_label": "weather",
        "server_url": mcp_url,
        "require_approval": "never",
    }
    weather = {
        "instructions": "Answer with the weather tool.",
        "input": "What is the weather in Paris?",
        "tools": [tool],
    }
    return {"web_search": (SEARCH, SEARCH_ANSWER), "mcp": (weather, WEATHER_ANSWER)}


def direct_calls(
    backend: LocalIndexBackend, mcp_url: str, settings: Any
) -> dict[str, Callable[[], Awaitable[None]]]:
    """Per kind: the backend's own call, with the inputs the model gives the server."""
    policy = settings.mcp.policy
    assert policy is not None
    weather = McpServer("weather", mcp_url, {})

    async def search() -> None:
        found = await backend.search("capital of France", SearchOptions())
        assert found, "the index found nothing"
        assert found[0].url == "https://en.wikipedia.org/wiki/Paris", found

    async def weather_call() -> None:
        outcome = await call_tool(
            weather, "get_weather", {"city": "Paris"}, policy, settings.mcp.timeout_s
        )
        assert outcome.output == "sunny, 18C", outcome

    return {"web_search": search, "mcp": weather_call}


async def run(runs: int, warmup: int) -> dict[str, list[Sample]]:
    settings = hosted_settings()
    model = dataclasses.replace(settings.model, model_path=str(FIXTURE), alias=MODEL)
    samples: dict[str, list[Sample]] = {kind: [] for kind in SPANS}
    async with trio.open_nursery() as nursery, start_mcp_server("streamable-http") as mcp:
        server: ServerHandle = await nursery.start(
            serve, dataclasses.replace(settings, model=model)
        )
        backend = LocalIndexBackend(INDEX, settings.web_search.timeout_s)
        await backend.ensure_index()
        direct = direct_calls(backend, mcp.url, settings)
        url = f"{server.base_url}/v1/responses"
        async with httpx2.AsyncClient(timeout=DEADLINE) as http:
            for index in range(warmup + runs):
                for kind, (body, answer) in requests(mcp.url).items():
                    request = {"model": MODEL, "temperature": 0, **body}
                    with trio.fail_after(DEADLINE):
                        if index % 2:  # the order flips every run
                            backend_s = await timed(direct[kind])
                            events = await stream(http, url, request)
                        else:
                            events = await stream(http, url, request)
                            backend_s = await timed(direct[kind])
                    hosted_s, delta_s, response_s = measure_stream(kind, events, answer)
                    if index >= warmup:
                        samples[kind].append(Sample(hosted_s, backend_s, delta_s, response_s))
        await backend.aclose()
        nursery.cancel_scope.cancel()
    return samples


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(samples: list[Sample]) -> dict[str, Any]:
    figures = {
        "hosted_call_s": spread([s.hosted for s in samples]),
        "backend_s": spread([s.backend for s in samples]),
        "added_per_run_s": spread([s.hosted - s.backend for s in samples]),
        "to_first_delta_s": spread([s.to_first_delta for s in samples]),
        "response_s": spread([s.response for s in samples]),
    }
    hosted, backend = figures["hosted_call_s"]["median"], figures["backend_s"]["median"]
    ratio = hosted / backend if backend > 0 else float("inf")
    return {**figures, "added_s": hosted - backend, "hosted_over_backend": ratio}


def print_table(summaries: dict[str, dict[str, Any]], runs: int) -> None:
    rows = [
        ("hosted call (client)", "hosted_call_s"),
        ("backend (direct)", "backend_s"),
        ("added, per run", "added_per_run_s"),
        (".completed -> 1st delta", "to_first_delta_s"),
        ("whole response", "response_s"),
    ]
    print(f"\n{runs} runs each; ms, median [min - max]:")
    print(f"  {'':26s}" + "".join(f"{kind:>28s}" for kind in summaries))
    for label, key in rows:
        cells = []
        for summary in summaries.values():
            f = summary[key]
            cells.append(
                f"{f['median'] * 1000:8.2f} [{f['min'] * 1000:6.2f} - {f['max'] * 1000:6.2f}]"
            )
        print(f"  {label:26s}" + "".join(f"{cell:>28s}" for cell in cells))
    added = "".join(f"{s['added_s'] * 1000:8.2f}{'':17s}".rjust(28) for s in summaries.values())
    print(f"  {'added (medians)':26s}" + added)
    ratios = "".join(
        f"{s['hosted_over_backend']:7.2f}x{'':17s}".rjust(28) for s in summaries.values()
    )
    print(f"  {'hosted / backend':26s}" + ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    facts = machine()
    for key, value in facts.items():
        print(f"{key}: {value}")
    print(f"OpenBLAS {'loaded' if facts['openblas_loaded'] else 'not loaded (reference BLAS)'}")
    samples = trio.run(run, args.runs, args.warmup)
    summaries = {kind: summarize(runs) for kind, runs in samples.items()}
    print_table(summaries, args.runs)
    report = {"machine": facts, "runs": args.runs, "warmup": args.warmup, "kinds": summaries}
    print("\n" + json.dumps(report))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"hosted_calls-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
