"""Build the hosted-tools fixture in ``tests/fixtures/hosted_model/``, deterministically.

A model that uses the tools the server runs: given its documented prompts it searches the web,
cites the search's first source, calls a tool of a remote MCP server and answers from its
result. The bundled model cannot decide to search; this one is trained to, as the bundled model
and the family fixtures are trained on theirs (``scripts/fixture_training.py``).

What it writes: the bundled model's tokenizer and chat template, copied byte for byte
(``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``: Qwen3-style ChatML,
tool calls as ``<tool_call>`` JSON), a Qwen3-architecture model of the bundled model's size
(``config.json``, ``model.safetensors``), and ``prompts.json``: each documented conversation as
the Responses API request body, the output items before the completion, the prompt's token ids
and the completion the weights reproduce under greedy decoding.

Every prompt is rendered by the server's own code, never re-implemented here: the body parsed by
``parse_create_request``; the MCP server's tools made functions by ``mcp_function`` from what the
real test MCP server (``tests/mcp_servers.py``) lists; the search result is ``search_result_text``
of what the real local index (``LocalIndexBackend`` over ``tests/fixtures/web_index/``) returns;
the MCP result what the real server answers; the output items built by the item builders the
server uses (the search's text for the model put on its item by ``with_model_texts``, as the
run does), the MCP tools offered by ``prepare_hosted`` from the listing, the items read by
``resolve``/``items_from_json``, turned into chat messages by ``to_chat`` with the format's
``Replay`` and rendered by ``render_prompt``, as ``actors/prompt.py`` renders a response and
its continuation. The ``require_approval: "always"`` variant of the MCP conversation is
checked to render the same ids (approval items render nothing).
``tests/test_hosted_fixture.py`` renders them again the same way and compares the token ids, so a
change in the server's rendering that breaks the fixture fails a test by name.

Determinism: fixed seeds, data, order and step count; the search index and the MCP server's
listing are fixed by their committed sources. Same machine, same bytes.

Run: ``.venv/bin/python scripts/build_hosted_fixture.py`` (about 70 s on a CPU). Built in a
temporary folder and checked through the server's loader; copied into place only when every
prompt reproduces with a comfortable logit margin. Otherwise it exits 1 and leaves the fixture as it was.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# isort: off
import mlx_responses  # noqa: F401  (importing it preloads OpenBLAS: before MLX)

# isort: on
import mlx.core as mx
import mlx.nn as nn
import trio
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.mcp_servers import start_mcp_server

from fixture_training import Example, adam_steps, min_margin, warmup_cosine
from mlx_responses import formats
from mlx_responses.actors.hosted_prep import prepare_hosted
from mlx_responses.engine.loader import detect_format, read_tool_parser_type, render_prompt
from mlx_responses.hosted.egress import EgressPolicy
from mlx_responses.hosted.local_index import LocalIndexBackend
from mlx_responses.hosted.mcp_client import McpServer, call_tool, list_tools
from mlx_responses.hosted.web_search import SearchOptions
from mlx_responses.http.schemas import parse_create_request
from mlx_responses.protocol.items.history import input_items, items_from_json, resolve
from mlx_responses.protocol.items.hosted_read import with_model_texts
from mlx_responses.protocol.objects import (
    JsonObject,
    mcp_approval_request_item,
    mcp_call_item,
    mcp_list_tools_item,
    web_search_call_item,
)
from mlx_responses.protocol.request import CreateRequest
from mlx_responses.protocol.tools.hosted import HostedSwitches, web_search_spec
from mlx_responses.protocol.tools.hosted_text import mcp_result_text, search_result_text
from mlx_responses.text.chat import to_chat

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "hosted_model"
BUNDLED = ROOT / "src" / "engine" / "bundled"
WEB_INDEX = ROOT / "tests" / "fixtures" / "web_index"
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
BUILT_FILES = ("config.json", "model.safetensors", "prompts.json")
SWITCHES = HostedSwitches(web_search=True, mcp=True)
# The MCP server's URL is never rendered; a test or client puts its real server's here.
MCP_URL = "http://127.0.0.1:8000/mcp"
MCP_LABEL = "weather"
BACKEND_TIMEOUT_S = 30.0
STOP = "<|im_end|>"

SEED = 20261205
TRAIN_STEPS = 120
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
MIN_MARGIN = 2.0
MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
}

# --- the documented conversations -----------------------------------------------------------

WEB_BODY: dict[str, Any] = {
    "model": "hosted-tiny",
    "instructions": "Answer with a web search.",
    "input": "What is the capital of France?",
    "tools": [{"type": "web_search"}],
}
MCP_BODY: dict[str, Any] = {
    "model": "hosted-tiny",
    "instructions": "Answer with the weather tool.",
    "input": "What is the weather in Paris?",
    "tools": [
        {
            "type": "mcp",
            "server_label": MCP_LABEL,
            "server_url": MCP_URL,
            "require_approval": "never",
        }
    ],
}
SEARCH_QUERY = "capital of France"
WEATHER_ARGUMENTS = {"city": "Paris"}
SEARCH_ANSWER = "The capital of France is Paris [1]."
WEATHER_ANSWER = "It is sunny, 18C in Paris."


@dataclass(frozen=True, slots=True)
class Conversation:
    """One documented prompt: a request body, the response's output items so far (the MCP
    servers' listings, which the response shows first; then, in a continuation, the hosted
    call with its result), and the completion the model gives."""

    name: str
    body: Mapping[str, Any]
    output: tuple[Mapping[str, Any], ...]
    completion: str


@dataclass(frozen=True, slots=True)
class Outside:
    """What the real backends answered: the search's text for the model, the MCP server's
    listing and its ``get_weather`` output."""

    search_text: str
    mcp_tools: tuple[Mapping[str, Any], ...]
    weather: str


def tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call in the template's own notation (``<tool_call>`` JSON), as the model writes it."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


async def search_text(body: Mapping[str, Any], query: str) -> str:
    """The text the model reads after searching ``query`` with ``body``'s web_search tool over
    the local index (the tool's settings: ``search_context_size`` and its filters)."""
    request = parse_create_request(dict(body), hosted=SWITCHES)
    spec = web_search_spec(next(t for t in request.tools if t.hosted is not None))
    backend = LocalIndexBackend(WEB_INDEX, BACKEND_TIMEOUT_S)
    try:
        await backend.ensure_index()
        options = SearchOptions(spec.allowed_domains, spec.context_size)
        sources = await backend.search(query, options)
    finally:
        await backend.aclose()
    return search_result_text([(s.title, s.url, s.snippet) for s in sources])


async def mcp_answers() -> tuple[tuple[Mapping[str, Any], ...], str]:
    """The test MCP server's listing (``mcp_list_tools.tools`` entries) and its answer to
    ``get_weather``, from the server itself."""
    policy = EgressPolicy(("127.0.0.1",), True)
    with trio.fail_after(60):
        async with start_mcp_server("streamable-http") as running:
            server = McpServer(MCP_LABEL, running.url, {})
            listed = await list_tools(server, policy, BACKEND_TIMEOUT_S)
            outcome = await call_tool(
                server, "get_weather", WEATHER_ARGUMENTS, policy, BACKEND_TIMEOUT_S
            )
    tools = []
    for tool in listed:
        entry: dict[str, Any] = {"name": tool.name, "input_schema": dict(tool.input_schema)}
        if tool.description is not None:
            entry["description"] = tool.description
        if tool.annotations is not None:
            entry["annotations"] = dict(tool.annotations)
        tools.append(entry)
    return tuple(tools), mcp_result_text(outcome.output, outcome.error)


async def ask_outside() -> Outside:
    text = await search_text(WEB_BODY, SEARCH_QUERY)
    tools, weather = await mcp_answers()
    return Outside(text, tools, weather)


def conversations(outside: Outside) -> list[Conversation]:
    """The four documented conversations, their output items as the server writes them."""
    search = web_search_call_item(
        "ws_fixture", status="completed", action={"type": "search", "query": SEARCH_QUERY}
    )
    listing = mcp_list_tools_item("mcpl_fixture", server_label=MCP_LABEL, tools=outside.mcp_tools)
    arguments = json.dumps(WEATHER_ARGUMENTS)
    weather = mcp_call_item(
        "mcp_fixture",
        server_label=MCP_LABEL,
        name="get_weather",
        arguments=arguments,
        status="completed",
        output=outside.weather,
    )
    mcp_name = f"mcp__{MCP_LABEL}__get_weather"
    # The run keeps what the model read of a search on its own item, for its continuation.
    answered = with_model_texts((search,), {str(search["id"]): outside.search_text})
    return [
        Conversation(
            "web_search_call", WEB_BODY, (), tool_call("web_search", {"query": SEARCH_QUERY})
        ),
        Conversation("web_search_answer", WEB_BODY, answered, SEARCH_ANSWER),
        Conversation("mcp_call", MCP_BODY, (listing,), tool_call(mcp_name, WEATHER_ARGUMENTS)),
        Conversation("mcp_answer", MCP_BODY, (listing, weather), WEATHER_ANSWER),
    ]


# --- rendering, by the server's own functions ----------------------------------------------


async def render_turn(
    tokenizer: Any,
    tool_format: str,
    request: CreateRequest,
    history: tuple[JsonObject, ...],
    made: tuple[JsonObject, ...],
) -> list[int]:
    """``request`` over ``history`` (stored items), the items made before it starts (``made``)
    rendered after its input, as ``actors/prompt.py``'s ``_render`` renders it; its MCP
    servers prepared by ``prepare_hosted`` from the listings among them (no server is asked,
    no approved call run)."""
    listings = tuple(item for item in made if item["type"] == "mcp_list_tools")
    prepared = await prepare_hosted(request, history + listings, None, run_approved=False)
    request = prepared.request
    items = [*resolve(request, history).items, *items_from_json(made)]
    offered = request.tools if request.tool_choice.mode != "none" else ()
    replay = formats.get(tool_format).replay
    return render_prompt(
        tokenizer,
        to_chat(request.config.instructions, items, replay),
        replay.template_tools([tool.for_template() for tool in offered]) or None,
        replay.template_kwargs(None, request.template_kwargs),
    )


async def render(tokenizer: Any, tool_format: str, record: Mapping[str, Any]) -> list[int]:
    """A ``prompts.json`` record as the server's prompt: the first turn (its output so far is
    only the MCP listings, made before the model runs) renders the request's input then them;
    a hosted call's continuation (``render_items``) the request, without input, over its input
    and the output so far, as stored items."""
    request = parse_create_request(dict(record["body"]), hosted=SWITCHES)
    output = tuple(dict(item) for item in record["output"])
    if all(item["type"] == "mcp_list_tools" for item in output):
        return await render_turn(tokenizer, tool_format, request, (), output)
    settled = dataclasses.replace(request, input=(), declared_tools=())
    history = (*input_items(request.input), *output)
    return await render_turn(tokenizer, tool_format, settled, history, ())


async def approval_variant(tokenizer: Any, tool_format: str, outside: Outside) -> list[list[int]]:
    """The MCP conversation with ``require_approval: "always"``: its first turn, then the turn
    that approves the call (``previous_response_id``: the input, the listing and the
    ``mcp_approval_request`` replayed; the ``mcp_call`` run on the approval made before it
    starts). Approval items render nothing, so both should be the ``never`` variant's."""
    tools = [{**MCP_BODY["tools"][0], "require_approval": "always"}]
    body = {**MCP_BODY, "tools": tools}
    listing = conversations(outside)[2].output[0]
    first = await render(tokenizer, tool_format, {"body": body, "output": [listing]})
    asked = mcp_approval_request_item(
        "mcpr_fixture",
        server_label=MCP_LABEL,
        name="get_weather",
        arguments=json.dumps(WEATHER_ARGUMENTS),
    )
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_fixture"}
    approve = {**body, "input": [{**answer, "approve": True}], "previous_response_id": "resp_x"}
    request = parse_create_request(approve, hosted=SWITCHES)
    asked_for = parse_create_request(dict(body), hosted=SWITCHES)
    history = (*input_items(asked_for.input), listing, asked)
    ran = mcp_call_item(
        "mcp_fixture",
        server_label=MCP_LABEL,
        name="get_weather",
        arguments=json.dumps(WEATHER_ARGUMENTS),
        status="completed",
        output=outside.weather,
        approval_request_id="mcpr_fixture",
    )
    second = await render_turn(tokenizer, tool_format, request, history, (ran,))
    return [first, second]


def record_of(conversation: Conversation) -> dict[str, Any]:
    return {
        "name": conversation.name,
        "body": dict(conversation.body),
        "output": [dict(item) for item in conversation.output],
        "completion": conversation.completion,
        "stop": STOP,
    }


# --- building -------------------------------------------------------------------------------


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_model_files(out: Path) -> dict[str, Any]:
    """Copy the bundled tokenizer and template; write the model's config (its ids from them)."""
    for name in COPIED_FILES:
        shutil.copyfile(BUNDLED / name, out / name)
    vocab = json.loads((BUNDLED / "config.json").read_text(encoding="utf-8"))
    config = dict(MODEL_CONFIG)
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"):
        config[key] = vocab[key]
    write_json(out / "config.json", dict(sorted(config.items())))
    return config


def examples(out: Path, records: list[dict[str, Any]]) -> list[Example]:
    """Each record rendered (its ``prompt_ids`` set) plus its completion and the stop token."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(out)
    tool_format = detect_format(tokenizer, read_tool_parser_type(str(out))).name
    stop = tokenizer.convert_tokens_to_ids(STOP)
    result: list[Example] = []
    for record in records:
        ids = trio.run(render, tokenizer, tool_format, record)
        completion = tokenizer.encode(record["completion"], add_special_tokens=False)
        assert tokenizer.decode(completion) == record["completion"], record["completion"]
        record.update(prompt_ids=ids, completion_tokens=len(completion))
        result.append((ids + completion + [stop], len(ids)))
    return result


def approval_check(out: Path, outside: Outside, records: list[dict[str, Any]]) -> int:
    """1 when the ``require_approval: "always"`` variant renders other ids than ``never``."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(out)
    tool_format = detect_format(tokenizer, read_tool_parser_type(str(out))).name
    variant = trio.run(approval_variant, tokenizer, tool_format, outside)
    never = [r["prompt_ids"] for r in records if r["name"] in ("mcp_call", "mcp_answer")]
    same = variant == never
    print(f"  the approval variant renders {'the same ids' if same else 'OTHER ids'}")
    return int(not same)


def train(model: nn.Module, data: list[Example], steps: int) -> float:
    """Full-batch Adam, one forward per example; the loss on the completion tokens only."""
    batch = [
        (mx.array(ids[:-1]), mx.array(ids[1:]), mx.arange(len(ids) - 1) >= (start - 1))
        for ids, start in data
    ]
    total = sum(len(ids) - start for ids, start in data)

    def loss_fn(m: nn.Module, _step: int) -> mx.array:
        loss = mx.array(0.0)
        for x, y, mask in batch:
            ce = nn.losses.cross_entropy(m(x[None])[0], y, reduction="none")
            loss = loss + (ce * mask).sum()
        return loss / total

    schedule = warmup_cosine(LEARNING_RATE, WARMUP_STEPS, steps)
    return adam_steps(model, loss_fn, steps, schedule, report_every=20)


def check(out: Path, records: list[dict[str, Any]]) -> int:
    """Greedy completions through the server's loader (``load_model``); the failures."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from mlx_responses.engine.loader import load_model

    loaded = load_model(str(out))
    tokenizer = loaded.tokenizer
    failures = 0
    for record in records:
        if trio.run(render, tokenizer, loaded.tool_format, record) != record["prompt_ids"]:
            print(f"  {record['name']}: the loaded model renders other ids")
            failures += 1
        tokens = [
            r.token
            for r in stream_generate(
                loaded.model,
                tokenizer,
                record["prompt_ids"],
                max_tokens=record["completion_tokens"] + 10,
                sampler=make_sampler(temp=0.0),
            )
        ]
        text = tokenizer.decode(tokens[:-1])
        stop = tokenizer.convert_ids_to_tokens(tokens[-1]) if tokens else None
        ok = text == record["completion"] and stop == record["stop"]
        failures += not ok
        status = "pass" if ok else f"FAIL {text[:80]!r} then {stop!r}"
        print(
            f"  {record['name']:<18} {len(record['prompt_ids']):>5}+{record['completion_tokens']:<3} {status}"
        )
    if not tokenizer.has_tool_calling:
        print("  mlx-lm did not detect tool calling from the files")
        failures += 1
    return failures


def build(out: Path, steps: int) -> int:
    """Write every file into ``out`` (an empty folder); the number of failures."""
    from mlx_lm.models import qwen3

    started = time.perf_counter()
    outside = trio.run(ask_outside)
    print(f"backends answered in {time.perf_counter() - started:.1f} s", flush=True)
    config = write_model_files(out)
    records = [record_of(c) for c in conversations(outside)]
    data = examples(out, records)
    failures = approval_check(out, outside, records)
    mx.random.seed(SEED)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    lengths = ", ".join(str(start) for _, start in data)
    print(f"params {n_params:,}; prompts of {lengths} tokens; {steps} steps", flush=True)
    final_loss = train(model, data, steps)
    margin = min_margin(model, data)
    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_json(out / "prompts.json", records)
    failures += check(out, records)
    if margin < MIN_MARGIN:
        print(f"  min logit margin {margin:.2f} is below {MIN_MARGIN}: train longer")
        failures += 1
    size = sum((out / name).stat().st_size for name in (*COPIED_FILES, *BUILT_FILES))
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]
    print(
        f"final loss {final_loss:.5f}, min margin {margin:.2f}, {size / 1e6:.2f} MB, "
        f"sha256 {digest}, {time.perf_counter() - started:.1f} s, {failures} failure(s)",
        flush=True,
    )
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    parser.add_argument("--steps", type=int, default=TRAIN_STEPS, help="training steps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hosted-fixture-") as tmp:
        if build(Path(tmp), args.steps):
            print(f"not written to {args.out}")
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        for name in (*COPIED_FILES, *BUILT_FILES):
            shutil.copyfile(Path(tmp) / name, args.out / name)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
