"""Constrained decoding with the real bundled model and mlx-lm: output always follows the grammar.

Generation runs on this test's thread (the only one touching MLX here), through
``mlx_lm.stream_generate`` and through ``BatchGenerator`` (the server's path), greedy and at
temperature 1.0 with a fixed ``mx.random.seed``. JSON outputs are checked with a small JSON-schema
checker written here (``jsonschema`` is not a dependency).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm import load, stream_generate
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.constrain import (
    Constraints,
    Grammar,
    InvalidSchema,
    make_logits_processor,
)

MAX_TOKENS = 200
HELLO = [{"role": "user", "content": "Reply with: hello"}]
CAT = [{"role": "user", "content": "Give me a JSON object describing a cat."}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]

GET_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The name of the city."}},
        "required": ["city"],
    },
    "strict": True,
}
GET_TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the time in a time zone.",
    "parameters": {
        "type": "object",
        "properties": {
            "zone": {"enum": ["UTC", "CET", "PST"]},
            "seconds": {"type": "boolean"},
        },
        "required": ["zone", "seconds"],
        "additionalProperties": False,
    },
    "strict": True,
}
ADD = {
    "type": "function",
    "function": {  # Chat Completions' nested form is accepted too
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOL_CALL = re.compile(r"\A<tool_call>\n(?P<call>\{.*\})\n</tool_call>\Z", re.DOTALL)


# -- fixtures and drivers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled() -> tuple[Any, Any]:
    model, tokenizer = load(str(BUNDLED_MODEL_PATH))[:2]
    return model, tokenizer


@pytest.fixture(scope="module")
def constraints(bundled: tuple[Any, Any]) -> Constraints:
    return Constraints(bundled[1])


def prompt_ids(
    bundled: tuple[Any, Any],
    messages: list[dict[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    ids: list[int] = bundled[1].apply_chat_template(
        messages, tools=tools, add_generation_prompt=True
    )
    return ids


def generate(
    bundled: tuple[Any, Any],
    constraints: Constraints,
    grammar: Grammar,
    messages: list[dict[str, Any]],
    *,
    temperature: float = 0.0,
    seed: int = 0,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, str | None]:
    """Text (end of turn excluded) and finish reason of one constrained generation."""
    model, tokenizer = bundled
    mx.random.seed(seed)
    text, finish = "", None
    for response in stream_generate(
        model,
        tokenizer,
        prompt_ids(bundled, messages, tools),
        max_tokens=MAX_TOKENS,
        sampler=make_sampler(temp=temperature),
        logits_processors=[make_logits_processor(constraints, grammar)],
    ):
        text += response.text
        finish = response.finish_reason
    return text, finish


# -- a small JSON-schema checker ----------------------------------------------------------------


def violations(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """What in ``value`` breaks ``schema`` (the keywords the generated schemas use)."""
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} != {schema['const']!r}")
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    if kind is not None and not checks[kind](value):
        return [*errors, f"{path}: {value!r} is not of type {kind}"]
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in properties:
                errors += violations(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected property {key!r}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        for i, item in enumerate(value):
            errors += violations(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < schema.get("minimum", value):
            errors.append(f"{path}: {value} < {schema['minimum']}")
        if value > schema.get("maximum", value):
            errors.append(f"{path}: {value} > {schema['maximum']}")
    return errors


def test_checker_catches_violations() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "maximum": 3}, "b": {"enum": ["x"]}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    assert violations({"a": 3, "b": "x"}, schema) == []
    assert len(violations({"a": 4, "c": True}, schema)) == 3
    assert violations({"a": True, "b": "x"}, schema) == ["$.a: True is not of type integer"]


# -- a Hypothesis family of simple schemas ---------------------------------------------------------

names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


@st.composite
def strings(draw: st.DrawFn) -> dict[str, Any]:
    top = draw(st.integers(1, 10))
    schema: dict[str, Any] = {"type": "string", "maxLength": top}
    if draw(st.booleans()):
        schema["minLength"] = draw(st.integers(0, top))
    return schema


@st.composite
def integers(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-1000, 1000))
    return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 5000))}


scalars = st.one_of(
    strings(),
    integers(),
    st.just({"type": "boolean"}),
    st.lists(names, min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
    st.lists(st.integers(-9, 99), min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
)


@st.composite
def arrays(draw: st.DrawFn) -> dict[str, Any]:
    top = draw(st.integers(0, 4))
    schema: dict[str, Any] = {"type": "array", "items": draw(scalars), "maxItems": top}
    if draw(st.booleans()):
        schema["minItems"] = draw(st.integers(0, top))
    return schema


@st.composite
def objects(draw: st.DrawFn, depth: int = 1) -> dict[str, Any]:
    values = st.one_of(scalars, arrays(), objects(depth - 1)) if depth else scalars
    properties = draw(st.dictionaries(names, values, min_size=1, max_size=4))
    required = [k for k in properties if draw(st.booleans())]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(schema=objects(), seed=st.integers(0, 2**16))
def test_json_schema_output_parses_and_validates(
    bundled: tuple[Any, Any], constraints: Constraints, schema: dict[str, Any], seed: int
) -> None:
    grammar = constraints.json_schema(schema)
    for temperature, messages in ((0.0, CAT), (1.0, HELLO)):
        text, finish = generate(
            bundled, constraints, grammar, messages, temperature=temperature, seed=seed
        )
        assert finish == "stop", (temperature, text)
        assert violations(json.loads(text), schema) == [], (temperature, text)


def test_json_schema_follows_the_schema_not_the_model(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    # Unconstrained, this prompt gives '{"name": "Tom", "animal": "cat", "age": 3}'.
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 10, "maximum": 12},
            "animal": {"enum": ["dog"]},
            "indoor": {"type": "boolean"},
        },
        "required": ["age", "animal", "indoor"],
        "additionalProperties": False,
    }
    for temperature in (0.0, 1.0):
        text, finish = generate(
            bundled, constraints, constraints.json_schema(schema), CAT, temperature=temperature
        )
        assert finish == "stop"
        value = json.loads(text)
        assert violations(value, schema) == []
        assert list(value) == ["age", "animal", "indoor"]
        assert text == json.dumps(value)  # compact, ", " and ": " separators


@pytest.mark.parametrize("seed", range(4))
def test_json_object_output_is_an_object(
    bundled: tuple[Any, Any], constraints: Constraints, seed: int
) -> None:
    for temperature in (0.0, 1.0):
        text, finish = generate(
            bundled, constraints, constraints.json_object(), CAT, temperature=temperature, seed=seed
        )
        assert finish == "stop"
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "objekt"}, "Invalid type: objekt"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "integer", "minimum": 5, "maximum": 2}, "minimum (5) is greater than maximum"),
        ({"type": "string", "pattern": "(("}, "regex parse error"),
        ({"$ref": "#/$defs/missing"}, "/$defs/missing"),
        ({"type": "object", "properties": {"a": {"type": 3}}}, "type must be a string"),
        ({"type": "object", "required": "a"}, "Expected array for 'required'"),
        ({"anyOf": []}, "anyOf is empty"),
        ({"type": "number", "minimum": float("nan")}, "not valid JSON"),
    ],
)
def test_invalid_schema_raises_with_a_clear_message(
    constraints: Constraints, schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSchema, match=re.escape(message)) as caught:
        constraints.json_schema(schema)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(("invalid JSON schema: ", "the JSON schema"))


def test_not_a_schema_object_raises(constraints: Constraints) -> None:
    with pytest.raises(InvalidSchema, match="must be an object"):
        constraints.json_schema(["type", "object"])  # type: ignore[arg-type]


def test_non_strict_schema_ignores_unimplemented_keywords(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    schema = {"type": "array", "items": {"type": "boolean"}, "maxItems": 3, "uniqueItems": True}
    grammar = constraints.json_schema(schema, strict=False)
    assert any("uniqueItems" in w for w in grammar.warnings)
    text, finish = generate(bundled, constraints, grammar, CAT)
    assert finish == "stop"
    assert violations(json.loads(text), schema) == []


def test_grammars_are_cached_and_immutable(constraints: Constraints) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}}}
    first = constraints.json_schema(schema)
    assert constraints.json_schema(dict(reversed(list(schema.items())))) is first
    assert constraints.json_schema(schema, strict=False) is not first
    assert constraints.json_object() is constraints.json_object()
    with pytest.raises(AttributeError):
        first.kind = "x"  # type: ignore[misc]


def test_compiling_from_many_threads_at_once(constraints: Constraints) -> None:
    results: list[Grammar] = []
    errors: list[BaseException] = []

    def compile_some(i: int) -> None:
        try:
            for j in range(5):
                schema = {"type": "object", "properties": {f"k{i}_{j}": {"type": "integer"}}}
                results.append(constraints.json_schema(schema))
            results.append(constraints.tool_call([GET_WEATHER], name=None, tool_format="hermes"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=compile_some, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(results) == 24


# -- tool calls ----------------------------------------------------------------------------------


def parse_call(text: str) -> dict[str, Any]:
    match = TOOL_CALL.match(text)
    assert match, text
    call: dict[str, Any] = json.loads(match["call"])
    assert list(call) == ["name", "arguments"]
    return call


def parameters_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function", tool)
    parameters: Mapping[str, Any] = fn["parameters"]
    return parameters


@pytest.mark.parametrize("with_tools_in_prompt", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_tool_call_on_a_prompt_that_never_calls_one(
    bundled: tuple[Any, Any],
    constraints: Constraints,
    with_tools_in_prompt: bool,
    temperature: float,
) -> None:
    grammar = constraints.tool_call([GET_WEATHER], name=None, tool_format="hermes")
    stopped = 0
    for seed in range(3):
        text, finish = generate(
            bundled,
            constraints,
            grammar,
            HELLO,
            temperature=temperature,
            seed=seed,
            tools=[GET_WEATHER] if with_tools_in_prompt else None,
        )
        # The city is free text the weights choose (not a documented answer). Sampled, it may
        # run to the token limit before the weights close it (the grammar bounds no string);
        # greedy it must close, and every call that ends must be valid.
        if finish == "length" and temperature > 0:
            assert text.startswith('<tool_call>\n{"name": "get_weather", "arguments": {')
            continue
        assert finish == "stop"
        stopped += 1
        call = parse_call(text)
        assert call["name"] == "get_weather"
        assert violations(call["arguments"], parameters_of(GET_WEATHER)) == []
    assert stopped >= 1


def test_required_tool_call_keeps_what_the_model_would_say(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    # The documented tool prompt (get_weather only); the grammar also allows get_time.
    grammar = constraints.tool_call([GET_WEATHER, GET_TIME], name=None, tool_format="hermes")
    text, _ = generate(bundled, constraints, grammar, WEATHER, tools=[GET_WEATHER])
    expected = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert text == f"<tool_call>\n{expected}\n</tool_call>"


@pytest.mark.parametrize("tool", [GET_TIME, ADD, GET_WEATHER], ids=["get_time", "add", "weather"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_named_function_is_forced_among_several(
    bundled: tuple[Any, Any], constraints: Constraints, tool: dict[str, Any], temperature: float
) -> None:
    tools = [GET_WEATHER, GET_TIME, ADD]
    name = tool.get("function", tool)["name"]
    grammar = constraints.tool_call(tools, name=name, tool_format="hermes")
    for seed in range(2):
        # The weather prompt: the model would call get_weather.
        text, finish = generate(
            bundled, constraints, grammar, WEATHER, temperature=temperature, seed=seed, tools=tools
        )
        assert finish == "stop"
        call = parse_call(text)
        assert call["name"] == name
        assert violations(call["arguments"], parameters_of(tool)) == []


def test_function_without_parameters_gets_empty_arguments(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    tools = [{"type": "function", "name": "ping", "parameters": None}]
    grammar = constraints.tool_call(tools, name="ping", tool_format="json_tools")
    text, _ = generate(bundled, constraints, grammar, HELLO, temperature=1.0)
    assert parse_call(text) == {"name": "ping", "arguments": {}}


@pytest.mark.parametrize(
    ("tools", "name", "message"),
    [
        ([GET_WEATHER], "get_time", "tool_choice names function 'get_time'"),
        ([], None, "at least one function tool"),
        ([{"type": "web_search"}], None, "tools[0].type 'web_search'"),
        ([{"type": "function", "parameters": {}}], None, "tools[0].name"),
        ([GET_WEATHER, GET_WEATHER], None, "used by more than one tool"),
        (
            [{"type": "function", "name": "f", "parameters": {"type": "string"}}],
            None,
            "must describe an object",
        ),
        (
            [{"type": "function", "name": "f", "strict": True, "parameters": {"not": {}}}],
            None,
            "parameters schema of function 'f'",
        ),
    ],
)
def test_bad_tools_raise_invalid_schema(
    constraints: Constraints, tools: list[dict[str, Any]], name: str | None, message: str
) -> None:
    with pytest.raises(InvalidSchema, match=re.escape(message)):
        constraints.tool_call(tools, name=name, tool_format="hermes")


def test_other_tool_formats_are_not_implemented(constraints: Constraints) -> None:
    with pytest.raises(NotImplementedError, match="--tool-format"):
        constraints.tool_call([GET_WEATHER], name=None, tool_format="mistral")


# -- the processor's contract ----------------------------------------------------------------------


def allowed(logits: Any) -> set[int]:
    row = logits.reshape(-1).tolist()
    return {i for i, v in enumerate(row) if v != float("-inf")}


def test_processor_tells_prompt_from_generated_tokens(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    tokenizer = bundled[1]
    width = 600  # wider than the 588-token vocabulary: padding rows are never allowed
    logits = mx.zeros((1, width))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    processor = make_logits_processor(constraints, constraints.json_schema(schema))
    prompt = prompt_ids(bundled, HELLO)  # ends in "\n": none of it is fed to the grammar
    first = processor(mx.array(prompt), logits)
    assert first.shape == logits.shape
    assert first.dtype == logits.dtype
    assert {tokenizer.decode([t]) for t in allowed(first)} <= {"{", '{"'}
    generated = tokenizer.encode('{"ok": true}', add_special_tokens=False)
    for i in range(1, len(generated) + 1):
        out = processor(mx.array(prompt + generated[:i]), logits)
        if i < len(generated):
            assert generated[i] in allowed(out)
    assert allowed(out) == set(tokenizer.eos_token_ids)
    # mlx-lm computes one more step after the end of turn: still only end of turn, no error.
    eos = next(iter(tokenizer.eos_token_ids))
    assert allowed(processor(mx.array([*prompt, *generated, eos]), logits)) == {eos}


def test_processor_rolls_back_when_tokens_shrink(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    tokenizer = bundled[1]
    logits = mx.zeros((1, 588))
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    processor = make_logits_processor(constraints, constraints.json_schema(schema))
    prompt = prompt_ids(bundled, HELLO)
    processor(mx.array(prompt), logits)
    head = tokenizer.encode('{"a": ', add_special_tokens=False)
    at_value = allowed(processor(mx.array(prompt + head), logits))
    done = prompt + head + tokenizer.encode("true}", add_special_tokens=False)
    assert allowed(processor(mx.array(done), logits)) == set(tokenizer.eos_token_ids)
    # As mlx-lm's speculative loop does: drop rejected tokens, then go on from the shorter list.
    assert allowed(processor(mx.array(prompt + head), logits)) == at_value


def test_token_outside_the_grammar_ends_the_turn(
    bundled: tuple[Any, Any], constraints: Constraints, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = bundled[1]
    logits = mx.zeros((1, 588))
    processor = make_logits_processor(constraints, constraints.json_object())
    prompt = prompt_ids(bundled, HELLO)
    processor(mx.array(prompt), logits)
    wrong = tokenizer.encode("hello", add_special_tokens=False)
    with caplog.at_level(logging.WARNING, logger="mlx_responses.engine.constrain"):
        out = processor(mx.array(prompt + wrong), logits)
    assert allowed(out) == set(tokenizer.eos_token_ids)
    assert "outside the grammar" in caplog.text


def test_grammar_from_another_tokenizer_is_refused(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    other = Constraints(bundled[1])
    with pytest.raises(ValueError, match="another Constraints"):
        make_logits_processor(constraints, other.json_object())


def test_batch_generator_mixes_constrained_and_free_sequences(
    bundled: tuple[Any, Any], constraints: Constraints
) -> None:
    model, tokenizer = bundled
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tools = [GET_WEATHER, GET_TIME]
    jobs = [
        (
            prompt_ids(bundled, HELLO),
            [make_logits_processor(constraints, constraints.json_schema(schema))],
        ),
        (prompt_ids(bundled, HELLO), []),
        (
            prompt_ids(bundled, CAT, tools),
            [
                make_logits_processor(
                    constraints, constraints.tool_call(tools, name="get_time", tool_format="hermes")
                )
            ],
        ),
        (prompt_ids(bundled, CAT), [make_logits_processor(constraints, constraints.json_object())]),
    ]
    generator = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    try:
        uids = generator.insert(
            [p for p, _ in jobs],
            max_tokens=[MAX_TOKENS] * len(jobs),
            logits_processors=[procs for _, procs in jobs],
        )
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        finish: dict[int, str] = {}
        while len(finish) < len(uids):
            _, responses = generator.next()
            for response in responses:
                if response.finish_reason == "stop":
                    finish[response.uid] = "stop"
                    continue
                tokens[response.uid].append(response.token)
                if response.finish_reason is not None:
                    finish[response.uid] = response.finish_reason
    finally:
        generator.close()
    texts = [tokenizer.decode(tokens[uid]) for uid in uids]
    assert all(finish[uid] == "stop" for uid in uids), texts
    assert violations(json.loads(texts[0]), schema) == []
    assert texts[1] == "hello"
    call = parse_call(texts[2])
    assert call["name"] == "get_time"
    assert violations(call["arguments"], parameters_of(GET_TIME)) == []
    assert json.loads(texts[3]) == {"name": "Tom", "animal": "cat", "age": 3}
