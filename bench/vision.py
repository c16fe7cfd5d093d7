"""Image requests against text requests on the vision fixture (issue 27), in one run.

Run::

    .venv/bin/python bench/vision.py [--model tests/fixtures/vision/qwen2-vl] [--repeats 5]
        [--side 224] [--streams 16] [--max-tokens 64]

1. Time to first token: an image request (the fixture's documented prompt, "What colour is the
   square?", with a solid square of ``--side`` pixels: ``(side / 28) ** 2`` image tokens) against
   a text request whose input token count (``POST /v1/responses/input_tokens``) is the image
   request's. Every request is new to the prefix cache (a shade of its own, a filler digit of its
   own); the two kinds alternate, ``--repeats`` of each, one at a time; TTFT is the time from
   sending the request to its first ``response.output_text.delta``; medians.
2. Throughput: ``--streams`` concurrent streams of "Count from 1 to 20." (the fixture answers it
   with and without a 56x56 square: about 50 tokens) with ``max_output_tokens``: all text, then
   half of them with a square (mixed, red, green and blue in turn, as the fixture is trained); tokens/s = the sum of ``usage.output_tokens`` over the time from the
   first request sent to the last terminal event. The two alternate (the order flips every
   repeat); medians.

The server runs with its prompt cache off (``--prompt-cache-bytes 0``; ``--prompt-cache`` keeps
it on), so every request is a full prefill: the image path itself is measured.

The figures that matter are the ratios (image / text TTFT, mixed / text throughput), measured in
the same run on the same server, because the machine is shared. Results are printed and written to
``bench/results/vision-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (
    default_server_command,
    machine_facts,
    new_client,
    running_server,
    stream_one,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
FIXTURE = ROOT / "tests" / "fixtures" / "vision" / "qwen2-vl"
COLOUR_PROMPT = "What colour is the square?"
COUNT_PROMPT = "Count from 1 to 20."
# The squares the fixture is trained to count after (scripts/build_vision_fixture.py).
SQUARES = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
COUNT_SIDE = 56
# A filler digit per TTFT repeat: a text prompt the prefix cache has not seen. Qwen's
# pre-tokenizer splits digits one by one, so n digits are n tokens.
DIGITS = "0123456789"


def png_data_url(rgb: tuple[int, int, int], side: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), rgb).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_input(
    text: str, rgb: tuple[int, int, int], side: int, image_first: bool = False
) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {"type": "input_text", "text": text},
        {"type": "input_image", "image_url": png_data_url(rgb, side)},
    ]
    if image_first:
        parts.reverse()
    return [{"type": "message", "role": "user", "content": parts}]


def body(input_: Any, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "input": input_,
        "temperature": 0,
        "max_output_tokens": max_tokens,
        "stream": True,
        "store": False,
    }


async def input_tokens(client: httpx.AsyncClient, base: str, input_: Any) -> int:
    reply = await client.post(
        base + "/v1/responses/input_tokens", json={"model": "bench", "input": input_}
    )
    if reply.status_code != 200:
        raise RuntimeError(f"input_tokens: HTTP {reply.status_code}: {reply.text}")
    return int(reply.json()["input_tokens"])


async def text_of_length(client: httpx.AsyncClient, base: str, digit: str, target: int) -> str:
    """The colour prompt after a filler of ``digit``s, as many as make ``target`` tokens."""
    count = max(0, target - await input_tokens(client, base, COLOUR_PROMPT))
    for _ in range(8):
        text = (digit * count + "\n" if count else "") + COLOUR_PROMPT
        got = await input_tokens(client, base, text)
        if got == target:
            return text
        count = max(0, count + target - got)
    raise RuntimeError(f"no filler of {digit!r} gives {target} tokens (last {got})")


def shade(index: int) -> tuple[int, int, int]:
    """A red of its own for each request: the prefix cache keys images by their pixels."""
    return (255 - index, index % 7, 0)


async def ttft(base: str, repeats: int, side: int) -> dict[str, Any]:
    async with new_client(4) as client:
        image_tokens = await input_tokens(client, base, image_input(COLOUR_PROMPT, shade(0), side))
        image_ttft: list[float] = []
        text_ttft: list[float] = []
        answers: dict[str, list[str]] = {"image": [], "text": []}
        for i in range(repeats):
            text = await text_of_length(client, base, DIGITS[i % len(DIGITS)], image_tokens)
            kinds = [("image", image_input(COLOUR_PROMPT, shade(i + 1), side)), ("text", text)]
            if i % 2:
                kinds.reverse()
            for kind, input_ in kinds:
                sent = time.perf_counter()
                result = await stream_one(client, base, body(input_, 8))
                (image_ttft if kind == "image" else text_ttft).append(result.first_delta_at - sent)
                answers[kind].append(result.text)
    image_median = statistics.median(image_ttft)
    text_median = statistics.median(text_ttft)
    return {
        "input_tokens": image_tokens,
        "image_ttft_s": image_ttft,
        "text_ttft_s": text_ttft,
        "image_ttft_median_s": image_median,
        "text_ttft_median_s": text_median,
        "ratio_image_over_text": image_median / text_median,
        "answers": answers,
    }


async def streams(base: str, count: int, images: int, max_tokens: int) -> tuple[float, int]:
    """``count`` concurrent count streams, ``images`` of them with a square: tokens/s and the
    tokens generated."""
    tokens = 0
    answers: dict[str, int] = {}

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal tokens
        input_: Any = COUNT_PROMPT
        if index < images:
            # The square before the text, as the fixture is trained to count after it.
            input_ = image_input(COUNT_PROMPT, SQUARES[index % len(SQUARES)], COUNT_SIDE, True)
        result = await stream_one(client, base, body(input_, max_tokens))
        tokens += result.output_tokens
        answers[result.text] = answers.get(result.text, 0) + 1

    async with new_client(count) as client:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(count):
                nursery.start_soon(one, client, index)
        elapsed = time.perf_counter() - started
    if len(answers) != 1:
        print(f"WARNING: the streams answered differently: {answers}", file=sys.stderr)
    return tokens / elapsed, tokens


async def throughput(base: str, repeats: int, count: int, max_tokens: int) -> dict[str, Any]:
    text_rates: list[float] = []
    mixed_rates: list[float] = []
    generated: dict[str, list[int]] = {"text": [], "mixed": []}
    # A warm-up of each kind: the first image pays for the vision tower's first compilation.
    await streams(base, 2, 1, 8)
    for i in range(repeats):
        order = [("text", text_rates, 0), ("mixed", mixed_rates, count // 2)]
        if i % 2:
            order.reverse()
        for kind, rates, images in order:
            rate, tokens = await streams(base, count, images, max_tokens)
            rates.append(rate)
            generated[kind].append(tokens)
    text_median = statistics.median(text_rates)
    mixed_median = statistics.median(mixed_rates)
    return {
        "streams": count,
        "image_streams_in_mixed": count // 2,
        "max_output_tokens": max_tokens,
        "text_tokens_per_s": text_rates,
        "mixed_tokens_per_s": mixed_rates,
        "tokens_generated": generated,
        "text_median": text_median,
        "mixed_median": mixed_median,
        "ratio_mixed_over_text": mixed_median / text_median,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(FIXTURE))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--side", type=int, default=224, help="the square's side in pixels")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--prompt-cache",
        action="store_true",
        help="keep the server's prompt cache on (off by default: every request prefills in full)",
    )
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = RESULTS_DIR / f"vision-server-{stamp}.log"
    # The prompt cache off by default: what is measured is the image path itself, every request
    # a full prefill.
    extra = [] if args.prompt_cache else ["--prompt-cache-bytes", "0"]
    with running_server(default_server_command(), args.model, log, extra_args=extra) as server:
        base = server.base_url
        first = trio.run(ttft, base, args.repeats, args.side)
        rates = trio.run(throughput, base, args.repeats, args.streams, args.max_tokens)
    report = {
        "model": args.model,
        "side": args.side,
        "repeats": args.repeats,
        "prompt_cache": args.prompt_cache,
        "machine": machine_facts(),
        "ttft": first,
        "throughput": rates,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"vision-{stamp}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"TTFT at {first['input_tokens']} input tokens: image {first['image_ttft_median_s'] * 1000:.1f} ms,"
        f" text {first['text_ttft_median_s'] * 1000:.1f} ms,"
        f" image/text {first['ratio_image_over_text']:.2f}"
    )
    print(
        f"{rates['streams']} streams: text {rates['text_median']:.1f} tok/s,"
        f" mixed ({rates['image_streams_in_mixed']} with an image) {rates['mixed_median']:.1f} tok/s,"
        f" mixed/text {rates['ratio_mixed_over_text']:.2f}"
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
