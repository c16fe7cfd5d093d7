"""Where one agent-loop turn's server time goes, per stage, socket continuation against replay.

Run::

    .venv/bin/python bench/websocket_stages.py [--turn 20] [--model src/engine/bundled]
        [--instructions-tokens 2000] [--item-tokens 300,600] [--repeats 20]

No server: the server's own functions, called in this process on the body ``bench/websocket.py``'s
Codex workload sends at turn ``--turn`` (the model's replies stand in as 16-token texts), each
timed ``--repeats`` times (the median is printed, in ms):

- the client's serialisation of the body (``json.dumps``, as httpx and the SDK do);
- the edge: strict JSON decode (``http.common.decode_json_body``) and validation
  (``http.schemas.parse_create_request``);
- items to chat messages (``protocol.history.items_from_json`` + ``model.chat.to_chat``);
- the chat template render (``apply_chat_template``, text only);
- tokenizing: the whole text (replay, and a socket continuation before issue 14's incremental
  tokenizing) against only the new text (``model.incremental_render``: the previous turn's
  render as the hint);
- the prefix-cache lookup (``model.prefix_cache.PrefixCache``, the previous turns' prompts
  stored): the same for every way.

The model's prefill and decode are not here: with the prompt cache they are the same for every
way (``bench/websocket.py`` reports the prefilled tokens per way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlx_responses.engine.prefix_cache import PrefixCache
from mlx_responses.http.common import decode_json_body
from mlx_responses.http.schemas import parse_create_request
from mlx_responses.protocol.items.history import input_items, items_from_json
from mlx_responses.text.chat import to_chat
from mlx_responses.text.incremental_render import IncrementalTokenizer, render_text
from mlx_responses.text.prompt_bounds import measure_tokenizer
from websocket import Workload

ROOT = Path(__file__).resolve().parent.parent


def reply(turn: int) -> dict[str, Any]:
    text = " ".join(f"step {turn} done" for _ in range(4))
    return {
        "type": "message",
        "id": f"msg_{turn:04d}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def timed(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turn", type=int, default=20)
    parser.add_argument("--model", default=str(ROOT / "src" / "engine" / "bundled"))
    parser.add_argument("--instructions-tokens", type=int, default=2000)
    parser.add_argument(
        "--item-tokens", type=lambda v: tuple(int(x) for x in v.split(",")), default=(300, 600)
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    args.workload, args.turns = "codex", args.turn
    work = Workload(args, args.model)
    history: list[dict[str, Any]] = []
    for turn in range(args.turn - 1):
        history += [*work.turn_input(0, turn), reply(turn)]
    new = work.turn_input(0, args.turn - 1)
    settings = {**work.settings(), "store": False}
    bodies = {
        "websocket": {**settings, "input": new, "previous_response_id": "resp_x"},
        "http-replay": {**settings, "input": history + new},
    }

    from mlx_lm import load

    tokenizer = load(args.model)[1]
    bound = measure_tokenizer(tokenizer)
    incremental = IncrementalTokenizer.for_tokenizer(tokenizer, bound)
    request = parse_create_request(decode_json_body(json.dumps(bodies["http-replay"])))
    tools = [tool.for_template() for tool in request.tools] or None
    items = input_items(request.input)

    def chat_of(these: tuple[Any, ...]) -> list[dict[str, Any]]:
        return to_chat(request.config.instructions, items_from_json(these))

    chat_before = chat_of(items[: -len(new)])
    chat_now = chat_of(items)
    text_before = render_text(tokenizer, chat_before, tools)
    text_now = render_text(tokenizer, chat_now, tools)
    known = incremental.tokenize(text_before, None)
    assert known is not None
    ids_now = tokenizer.encode(text_now, add_special_tokens=False)
    again = incremental.tokenize(text_now, known)
    assert again is not None
    assert list(again.ids) == list(ids_now), "not the full render's ids"

    cache: PrefixCache[int] = PrefixCache(max_bytes=1 << 40, max_entries=64)
    for turn in range(1, args.turn):
        ids = tokenizer.encode(
            render_text(tokenizer, chat_of(items[: turn * 3]), tools), add_special_tokens=False
        )
        cache.insert("", tuple(ids), turn, 1)
    prompt = tuple(ids_now)

    rows: dict[str, dict[str, float]] = {}
    for way, body in bodies.items():
        raw = json.dumps(body)
        these = items if way == "http-replay" else items[-len(new) :]
        rows[way] = {
            "body_bytes": len(raw),
            "client json.dumps": timed(lambda body=body: json.dumps(body), args.repeats),
            "decode_json_body": timed(lambda raw=raw: decode_json_body(raw), args.repeats),
            "parse_create_request": timed(
                lambda raw=raw: parse_create_request(decode_json_body(raw)), args.repeats
            )
            - timed(lambda raw=raw: decode_json_body(raw), args.repeats),
            "input_items (ids)": timed(
                lambda these=these: input_items(items_from_json(these)), args.repeats
            ),
            "items -> chat (whole history)": timed(lambda: chat_of(items), args.repeats),
            "template render (text)": timed(
                lambda: render_text(tokenizer, chat_now, tools), args.repeats
            ),
            "tokenize": timed(
                (lambda: tokenizer.encode(text_now, add_special_tokens=False))
                if way == "http-replay"
                else (lambda: incremental.tokenize(text_now, known)),
                args.repeats,
            ),
            "prefix-cache lookup": timed(lambda: cache.lookup("", prompt), args.repeats),
        }
    print(
        f"turn {args.turn}: {len(items)} items, {len(chat_now)} chat messages, "
        f"{len(prompt)} prompt tokens ({len(text_now)} characters), new text "
        f"{len(text_now) - len(text_before)} characters"
    )
    width = max(len(k) for k in rows["websocket"])
    print(f"{'stage (ms, median)':<{width}}  websocket  http-replay")
    for key in rows["websocket"]:
        print(f"{key:<{width}}  {rows['websocket'][key]:9.2f}  {rows['http-replay'][key]:11.2f}")
    print(json.dumps({"turn": args.turn, "prompt_tokens": len(prompt), "stages": rows}))


if __name__ == "__main__":
    main()
