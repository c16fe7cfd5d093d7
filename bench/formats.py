"""Output-format parsing cost per generated token, as a share of the bundled model's decode step.

Run::

    .venv/bin/python bench/formats.py [--repeats 30] [--decode-tokens 200]

For each registered format (``mlx_responses.formats``): a typical generation in that format
(reasoning, a sentence, one tool call with a few arguments; ``none`` has reasoning and text
only) is cut into the pieces the bundled tokenizer would stream (one token's text each), then
fed piece by piece to a fresh parser, and once more through the ``OutputShaper`` that turns
events into event-machine inputs. The time per piece is the minimum over ``--repeats`` runs
(on a shared machine the minimum is the steadiest estimate of the cost itself) and the median.

The decode step is the bundled model's, one greedy sequence through ``mlx_lm``'s
``stream_generate`` (``--decode-tokens`` tokens; the best of 3 runs). The share is the parsing
cost per token over that step; the target is under 2%. Results are printed and written to
``bench/results/formats-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from mlx_responses import formats
from mlx_responses.actors.output import OutputShaper
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH

RESULTS = Path(__file__).parent / "results"

REASONING = "The user wants the weather in Paris, so I call the weather tool with the city."
TEXT = "Let me look that up for you."
ARGS = '{"city": "Paris", "unit": "celsius", "days": 3}'

GENERATIONS: dict[str, str] = {
    "harmony": (
        f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>"
        f"commentary<|message|>{TEXT}<|end|><|start|>assistant to=functions.get_weather"
        f"<|channel|>commentary json<|message|>{ARGS}<|call|>"
    ),
    "hermes": (
        f'<think>\n{REASONING}\n</think>\n\n{TEXT}\n<tool_call>\n{{"name": "get_weather", '
        f'"arguments": {ARGS}}}\n</tool_call>'
    ),
    "qwen3_coder": (
        f"<think>\n{REASONING}\n</think>\n\n{TEXT}\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    ),
    "mistral": f"<think>\n{REASONING}\n</think>\n\n{TEXT}[TOOL_CALLS]get_weather[ARGS]{ARGS}",
    "llama3_json": f'{{"name": "get_weather", "parameters": {ARGS}}}',
    "none": f"<think>\n{REASONING}\n</think>\n\n{TEXT} It is sunny and 18 degrees in Paris.",
    # The families of ``formats.families`` (their notations as their templates write them).
    "glm47": (
        f"<think>{REASONING}</think>{TEXT}<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    ),
    "minimax_m2": (
        f"<think>{REASONING}</think>{TEXT}<minimax:tool_call>\n"
        '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="unit">celsius</parameter>\n<parameter name="days">3</parameter>\n'
        "</invoke>\n</minimax:tool_call>"
    ),
    "kimi_k2": (
        f"{TEXT}<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
    ),
    "deepseek_v3": (
        f"{TEXT}<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>"
        f"get_weather<\uff5ctool\u2581sep\uff5c>{ARGS}<\uff5ctool\u2581call\u2581end\uff5c>"
        "<\uff5ctool\u2581calls\u2581end\uff5c>"
    ),
    "gemma4": (
        f"<|channel>thought\n{REASONING}<channel|>{TEXT}<|tool_call>call:get_weather"
        '{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>,days:3}<tool_call|>'
    ),
    "pythonic": (
        f"{TEXT}<|tool_call_start|>[get_weather(city='Paris', unit='celsius', days=3)]"
        "<|tool_call_end|>"
    ),
    "function_gemma": (
        f"{TEXT}<start_function_call>call:get_weather"
        "{city:<escape>Paris<escape>,unit:<escape>celsius<escape>,days:3}<end_function_call>"
    ),
    "longcat": (
        f"<longcat_think>{REASONING}</longcat_think>{TEXT}<longcat_tool_call>get_weather\n"
        "<longcat_arg_key>city</longcat_arg_key>\n<longcat_arg_value>Paris</longcat_arg_value>\n"
        "<longcat_arg_key>unit</longcat_arg_key>\n<longcat_arg_value>celsius</longcat_arg_value>\n"
        "<longcat_arg_key>days</longcat_arg_key>\n<longcat_arg_value>3</longcat_arg_value>\n"
        "</longcat_tool_call>"
    ),
    "minicpm5": (
        f'<think>{REASONING}</think>{TEXT}<function name="get_weather">'
        '<param name="city">Paris</param><param name="unit">celsius</param>'
        '<param name="days">3</param></function>'
    ),
    "muse_spark": (
        f"<think>{REASONING}</think>{TEXT}<atem:function_calls>\n"
        '<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris</atem:parameter>\n'
        '<atem:parameter name="unit">celsius</atem:parameter>\n'
        '<atem:parameter name="days">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>'
    ),
    # As Kimi K3's template writes a turn after the prompt's ``<|open|>think<|sep|>`` (here
    # with the opener, so that the sample parses without the prompt).
    "kimi_k3": (
        f"<|open|>think<|sep|>{REASONING}<|close|>think<|sep|><|open|>response<|sep|>{TEXT}"
        '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"'
        '<|sep|><|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        '<|open|>argument key="unit" type="string"<|sep|>celsius<|close|>argument<|sep|>'
        '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>"
    ),
}
_THINK_OPENERS = ("<think>", "<|channel>", "<longcat_think>", "<|open|>think<|sep|>")


def pieces(tokenizer: Any, text: str) -> list[str]:
    """``text`` as the detokenizer would stream it: one token's text per piece (a token that
    ends inside a UTF-8 character waits for the rest, as mlx-lm's detokenizers do)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    out: list[str] = []
    shown = ""
    for k in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:k], skip_special_tokens=False)
        if decoded.endswith("\ufffd"):
            continue
        out.append(decoded[len(shown) :])
        shown = decoded
    return out


def _options(name: str) -> formats.ParseOptions:
    text = GENERATIONS[name]
    return formats.ParseOptions(
        tools_enabled=True, reasoning=any(opener in text for opener in _THINK_OPENERS)
    )


def check(name: str, chunks: list[str]) -> None:
    """The sample parses as meant: its call (and reasoning) come out, so the timing is real."""
    parser = formats.get(name).new_parser(_options(name))
    events = formats.coalesce([e for c in chunks for e in parser.feed(c)] + parser.finish())
    ends = [e for e in events if isinstance(e, formats.ToolCallEnd)]
    if name != "none":
        assert [(e.name, json.loads(e.arguments)) for e in ends] == [
            ("get_weather", json.loads(ARGS))
        ], events
    if REASONING in GENERATIONS[name]:
        assert formats.ReasoningChunk(REASONING) in events, events


def time_parse(name: str, chunks: list[str], repeats: int, *, shaped: bool) -> list[float]:
    """Microseconds per piece of each run."""
    fmt = formats.get(name)
    options = _options(name)
    runs = []
    for _ in range(repeats):
        parser = fmt.new_parser(options)
        start = time.perf_counter()
        if shaped:
            shaper = OutputShaper(parser, max_calls=None, declared=frozenset({"get_weather"}))
            for chunk in chunks:
                shaper.feed(chunk)
            shaper.finish()
        else:
            for chunk in chunks:
                parser.feed(chunk)
            parser.finish()
        runs.append((time.perf_counter() - start) / len(chunks) * 1e6)
    return runs


def decode_step_ms(model: Any, tokenizer: Any, tokens: int) -> float:
    """Milliseconds per generated token; end of sequence is masked so every run is ``tokens``
    long (the bundled model answers its prompts in a few tokens)."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say something short."}], add_generation_prompt=True
    )
    width = int(model(mx.array([prompt[:1]])).shape[-1])
    ban = mx.zeros((width,))
    ban[mx.array(sorted(tokenizer.eos_token_ids))] = -1e9

    def no_eos(_tokens: Any, logits: Any) -> Any:
        return logits + ban

    best = float("inf")
    for _ in range(3):
        last = None
        for response in stream_generate(
            model, tokenizer, prompt, max_tokens=tokens, logits_processors=[no_eos]
        ):
            last = response
        assert last is not None
        assert last.generation_tokens == tokens
        best = min(best, 1e3 / last.generation_tps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--decode-tokens", type=int, default=200)
    args = parser.parse_args()

    from mlx_lm import load

    model, tokenizer = load(str(BUNDLED_MODEL_PATH))[:2]
    step = decode_step_ms(model, tokenizer, args.decode_tokens)
    print(f"bundled model decode step: {step:.3f} ms/token (best of 3, {args.decode_tokens})")
    rows: dict[str, Any] = {}
    for name in formats.names():
        text = GENERATIONS.get(name)
        if text is None:
            continue  # a format added without a sample generation here
        chunks = pieces(tokenizer, text)
        check(name, chunks)
        parse = time_parse(name, chunks, args.repeats, shaped=False)
        shaped = time_parse(name, chunks, args.repeats, shaped=True)
        row = {
            "tokens": len(chunks),
            "parse_us_min": min(parse),
            "parse_us_median": statistics.median(parse),
            "shaped_us_min": min(shaped),
            "shaped_us_median": statistics.median(shaped),
            "share_of_decode_step": min(shaped) / 1e3 / step,
        }
        rows[name] = row
        print(
            f"{name:12} {row['tokens']:4} tokens  parse {row['parse_us_min']:6.2f} us/token "
            f"(median {row['parse_us_median']:6.2f})  + shaping {row['shaped_us_min']:6.2f} "
            f"(median {row['shaped_us_median']:6.2f})  = {100 * row['share_of_decode_step']:.2f}%"
            " of a decode step"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"formats-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "decode_step_ms": step,
                "repeats": args.repeats,
                "formats": rows,
            },
            indent=2,
        )
    )
    print(f"written to {out}")


if __name__ == "__main__":
    main()
