"""``mlx-responses serve --check``: start the real server, run one documented prompt through
it over HTTP (streamed), print the timings, stop.

Invariants:
- The whole server runs (actors, model thread, Hypercorn), on 127.0.0.1 with a free port, an
  in-memory store and no API keys, whatever the other flags say: a check changes no data.
- The prompt is the bundled model's documented prompt ``capital`` (docs/bundled-model.md) at
  temperature 0; for the bundled model the answer must be the documented one, for any other
  model any completed answer passes.
- Exit 0 when the response completed (and matched), 1 otherwise; never a traceback for a
  failed generation.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import trio

from .api_keys import OPEN
from .engine.bundled_model import BUNDLED_MODEL_PATH, load_bundled_prompts
from .server import serve
from .settings import ServerSettings
from .storage.choice import MEMORY

DEADLINE_SECONDS = 600
CHECK_PROMPT = "capital"  # "What is the capital of France?" -> "The capital of France is Paris."


@dataclass(frozen=True, slots=True)
class Streamed:
    status: str
    text: str
    first_token: float | None
    total: float
    input_tokens: int
    output_tokens: int


def _stream(url: str, body: dict[str, Any]) -> Streamed:
    """POST a streamed create and read its SSE events (runs on a worker thread)."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        method="POST",
    )
    started = time.monotonic()
    first: float | None = None
    text: list[str] = []
    final: dict[str, Any] = {}
    with urllib.request.urlopen(request, timeout=DEADLINE_SECONDS) as reply:
        for raw in reply:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            kind = event.get("type", "")
            if kind == "response.output_text.delta":
                first = first if first is not None else time.monotonic() - started
                text.append(event.get("delta", ""))
            elif kind in ("response.completed", "response.failed", "response.incomplete"):
                final = event.get("response", {})
    usage = final.get("usage") or {}
    return Streamed(
        status=str(final.get("status", "no terminal event")),
        text="".join(text),
        first_token=first,
        total=time.monotonic() - started,
        input_tokens=int(usage.get("input_tokens", 0)),
        output_tokens=int(usage.get("output_tokens", 0)),
    )


async def _check(settings: ServerSettings) -> int:
    prompts = {p.name: p for p in load_bundled_prompts()}
    prompt = prompts.get(CHECK_PROMPT) or next(iter(prompts.values()))
    bundled = settings.model.model_path == str(BUNDLED_MODEL_PATH)
    print(f"mlx-responses check: loading {settings.model.alias} ({settings.model.model_path})")
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        rt = await nursery.start(serve, settings)
        loaded = time.monotonic() - started
        print(f"  started in       {loaded:.2f} s (model loaded, server listening)")
        body = {
            "model": rt.model.info.alias,
            "input": prompt.messages,
            "temperature": 0,
            "max_output_tokens": max(prompt.expected_tokens + 8, 32),
            "store": False,
            "stream": True,
        }
        print(f"  prompt           {prompt.name}: {prompt.messages[-1]['content']!r}")
        result = await trio.to_thread.run_sync(_stream, f"{rt.base_url}/v1/responses", body)
        rt.shutdown()
    first = f"{result.first_token:.3f} s" if result.first_token is not None else "none"
    print(f"  first token      {first}")
    rate = ""
    if result.first_token is not None and result.output_tokens > 1:
        decode = result.total - result.first_token
        if decode > 0:
            rate = f", {(result.output_tokens - 1) / decode:.1f} tokens/s after the first"
    print(
        f"  response         {result.total:.3f} s, {result.input_tokens} prompt tokens, "
        f"{result.output_tokens} output tokens{rate}"
    )
    print(f"  answer           {result.text!r} ({result.status})")
    if result.status != "completed":
        print("check failed: the response did not complete")
        return 1
    if bundled and result.text != prompt.expected:
        print(f"check failed: the documented answer is {prompt.expected!r}")
        return 1
    print("check passed" + (" (the documented answer)" if bundled else ""))
    return 0


def run_check(settings: ServerSettings) -> int:
    # Nothing is bound or written: no port, no store, no prompt cache on disk.
    model = dataclasses.replace(settings.model, prompt_cache_dir=None)
    quiet = dataclasses.replace(
        settings, host="127.0.0.1", port=0, api_keys=OPEN, store=MEMORY, model=model
    )
    return trio.run(_check, quiet)
