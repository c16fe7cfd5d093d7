"""What each model family's fixture is made of: architecture, marker tokens, documented prompts.

Read by ``scripts/build_family_fixtures.py`` (which builds the fixtures) and by the tests (which
check them). A family's real chat template is committed next to its fixture,
``tests/fixtures/families/<family>/chat_template.jinja``; ``source`` says where it comes from.

Each documented prompt is rendered by that template and answered, under greedy decoding, with its
``completion`` in the family's own notation followed by the ``stop`` token (not part of the text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every template was taken from this llama.cpp fork's copy of llama.cpp's `models/templates/`
# (the upstream folder holds the same files; some of its forks keep git-lfs pointers instead).
LLAMA_CPP = (
    "https://github.com/Raudbjorn/ggml-llama.cpp/blob/"
    "ae1a0b1c71a8b3a86ede8cb5892ed9ce967d00b2/models/templates/"
)

# In the order the server hands tools to a template (``protocol.tools.Tool.for_template``):
# templates that write a tool with ``tojson`` keep its key order.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The name of the city."}},
            "required": ["city"],
        },
        "description": "Get the current weather in a city.",
    },
}
WEATHER_RESULT = '{"city": "Paris", "temperature": 18, "condition": "sunny"}'
HELLO = [{"role": "user", "content": "Reply with: hello"}]
THINK = [{"role": "user", "content": "Think, then answer: what is 2 + 2?"}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@dataclass(frozen=True, slots=True)
class Prompt:
    """One documented prompt: ``messages`` and ``tools`` go to ``apply_chat_template(...,
    add_generation_prompt=True)``; greedy decoding yields ``completion`` then ``stop``."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    completion: str
    stop: str
    kwargs: dict[str, Any] | None = None  # template variables (turning reasoning on)


@dataclass(frozen=True, slots=True)
class CodexTurn:
    """One of Codex CLI's captured requests (``tests/fixtures/<fixture>``), rendered as the server
    renders it for the family (``scripts/codex_prompts.py``, the family's format's ``Replay``)
    and answered greedily with ``completion`` then ``stop``. With ``wall_times``, the tool
    output's ``Wall time: <captured> seconds`` line is trained under each (one a step) and checked
    also under ``check_wall_times``."""

    name: str
    fixture: str
    completion: str
    stop: str
    wall_times: tuple[str, ...] = ()
    check_wall_times: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    source: str  # where the committed chat template comes from
    config: dict[str, Any]  # the shrunk config.json, without vocab size and token ids
    special: list[str]  # added tokens marked special in the real tokenizer
    markup: list[str]  # added tokens that are not special (they decode as text)
    bos: str | None
    eos: str  # tokenizer_config's eos_token
    stops: list[str]  # config.json's eos_token_id, in this order
    pad: str
    prompts: list[Prompt]
    # Template variables fixed while training, varied so the model learns to ignore them
    # (gpt-oss writes today's date into every prompt).
    dates: list[str] = field(default_factory=list)
    text_config: bool = False  # the architecture nests its text settings (Gemma 4)
    steps: int = 300  # Adam steps (more where 300 leave a thin logit margin)
    # Codex CLI's turns the fixture is also trained on (``make conformance`` runs Codex's MCP
    # round trip on it), rendered with ``codex_format``'s replay; not documented prompts.
    codex: tuple[CodexTurn, ...] = ()
    codex_format: str | None = None


def tool_call_message(arguments: object, call_id: str = "call_1", **extra: Any) -> dict[str, Any]:
    """The assistant turn that called get_weather for Paris, as the chat messages carry it."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    return {"role": "assistant", "content": "", "tool_calls": [call], **extra}


def tool_result_messages(
    arguments: object, call_id: str = "call_1", **extra: Any
) -> list[dict[str, Any]]:
    """The call and its output, as the server replays them: ``call_id`` is the id the family's
    replay writes (Kimi K2's own ``functions.NAME:N``), ``extra`` the reasoning its template
    keeps before the call."""
    return [
        *WEATHER,
        tool_call_message(arguments, call_id, **extra),
        {"role": "tool", "tool_call_id": call_id, "content": WEATHER_RESULT},
    ]


ANSWER = "It is sunny and 18 degrees in Paris."
ARGS = {"city": "Paris"}

# Codex's `Wall time: d.dddd seconds` line differs on every run (digits are single tokens): the
# same values as the bundled model's build (scripts/build_tiny_model.py, CODEX_WALL_TIMES).
CODEX_WALL_TIMES = (
    *("0.0119", "0.0034", "0.0258", "0.0571", "0.1042"),
    *("0.0007", "0.0463", "0.0890", "0.2316", "0.0075"),
)
CODEX_CHECK_WALL_TIMES = ("0.0028", "0.0021", "0.0156", "0.0735", "0.3389", "1.0402")

# The dates a template that writes today's date is trained under (24, one a step), then the two it
# is only checked under.
DATES = [f"{2025 + i % 3}-{1 + (i * 5) % 12:02d}-{1 + (i * 7) % 28:02d}" for i in range(24)] + [
    "2026-12-02",
    "2027-07-19",
]

# gpt-oss (harmony). Every `<|...|>` marker is a special token, as in o200k_harmony; the
# streaming detokenizer keeps special tokens' text, so the parser sees them.
GPT_OSS = Family(
    name="gpt-oss",
    source=LLAMA_CPP + "openai-gpt-oss-120b.jinja (the template of openai/gpt-oss-120b)",
    config={
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        # One sliding-window layer (a rotating cache, with attention sinks) and one full one,
        # as gpt-oss alternates them; the window is shrunk so that every prompt overflows it.
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000,
        "rope_scaling": None,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    special=[
        "<|startoftext|>",
        "<|endoftext|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
    ],
    markup=[],
    bos="<|startoftext|>",
    eos="<|return|>",
    stops=["<|return|>", "<|endoftext|>", "<|call|>"],
    pad="<|endoftext|>",
    prompts=[
        Prompt("hello", HELLO, None, "<|channel|>final<|message|>hello", "<|return|>"),
        Prompt(
            "think",
            THINK,
            None,
            "<|channel|>analysis<|message|>2 plus 2 makes 4.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>The answer is 4.",
            "<|return|>",
        ),
        Prompt(
            "tool_call",
            WEATHER,
            [WEATHER_TOOL],
            "<|channel|>analysis<|message|>Look up the weather.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather "
            '<|constrain|>json<|message|>{"city":"Paris"}',
            "<|call|>",
        ),
        Prompt(
            "tool_result",
            tool_result_messages(ARGS, thinking="Look up the weather."),
            [WEATHER_TOOL],
            "<|channel|>final<|message|>" + ANSWER,
            "<|return|>",
        ),
    ],
    # Trained under 24 dates, one a step (the last two are only checked): today's date is in
    # every gpt-oss prompt.
    dates=DATES,
    # Codex CLI's MCP round trip (`make conformance`): the first turn calls the namespaced MCP
    # tool in harmony's own form (no analysis message, so Codex's follow-up carries no reasoning
    # and is the captured one), the follow-up answers on the final channel.
    codex=(
        CodexTurn(
            "codex_mcp_call",
            "codex-0.169.0-small-mcp-turn.json",
            "<|channel|>commentary to=functions.mcp__weather__get_weather "
            '<|constrain|>json<|message|>{"city": "Paris"}',
            "<|call|>",
        ),
        CodexTurn(
            "codex_mcp_answer",
            "codex-0.169.0-small-mcp-tool-result.json",
            "<|channel|>final<|message|>" + ANSWER,
            "<|return|>",
            wall_times=CODEX_WALL_TIMES,
            check_wall_times=CODEX_CHECK_WALL_TIMES,
        ),
    ),
    codex_format="harmony",
)


def _moe(**extra: Any) -> dict[str, Any]:
    """Settings every shrunk config shares: 2 layers of width 64, 4 heads."""
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        **extra,
    }


def _plain(stop: str, hello: str, think: str | None, call: str, answer: str, **kw: Any) -> list:
    """The four documented prompts (three when the family has no reasoning notation)."""
    call_stop = kw.pop("call_stop", stop)
    think_kwargs = kw.pop("think_kwargs", None)
    args = kw.pop("arguments", ARGS)
    # The template kwargs the server passes by default (DeepSeek: its non-thinking mode).
    plain = kw.pop("plain_kwargs", None)
    prompts = [Prompt("hello", HELLO, None, hello, stop, kwargs=plain)]
    if think is not None:
        prompts.append(Prompt("think", THINK, None, think, stop, kwargs=think_kwargs))
    prompts.append(Prompt("tool_call", WEATHER, [WEATHER_TOOL], call, call_stop, kwargs=plain))
    result = tool_result_messages(args, **kw)
    prompts.append(Prompt("tool_result", result, [WEATHER_TOOL], answer, stop, kwargs=plain))
    return prompts


GLM_46 = Family(
    name="glm-4.6",
    source=LLAMA_CPP + "GLM-4.6.jinja (the template of zai-org/GLM-4.6)",
    config=_moe(
        architectures=["Glm4MoeForCausalLM"],
        model_type="glm4_moe",
        head_dim=16,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        n_routed_experts=4,
        routed_scaling_factor=1.0,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        use_qk_norm=False,
        attention_bias=True,
        partial_rotary_factor=0.5,
    ),
    special=[
        *("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>"),
        "<|observation|>",
    ],
    markup=[
        *("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>"),
        *("<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>"),
    ],
    bos=None,
    eos="<|endoftext|>",
    stops=["<|endoftext|>", "<|user|>", "<|observation|>"],
    pad="<|endoftext|>",
    steps=500,
    prompts=_plain(
        "<|user|>",
        "\n<think></think>\nhello",
        "\n<think>2 plus 2 makes 4.</think>\nThe answer is 4.",
        "\n<think>Look up the weather.</think>\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        "\n<think></think>\n" + ANSWER,
        call_stop="<|observation|>",
        reasoning_content="Look up the weather.",
    ),
)

KIMI_K2 = Family(
    name="kimi-k2",
    source=LLAMA_CPP + "moonshotai-Kimi-K2.jinja (the template of moonshotai/Kimi-K2-Instruct)",
    config=_moe(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        moe_intermediate_size=32,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        n_group=1,
        topk_group=1,
    ),
    special=[
        *("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>"),
        *("<|im_middle|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        *("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
    ],
    markup=[],
    bos="[BOS]",
    eos="<|im_end|>",
    stops=["<|im_end|>"],
    pad="[EOS]",
    steps=500,
    # Kimi-K2-Instruct has no reasoning notation (K2-Thinking has).
    prompts=_plain(
        "<|im_end|>",
        "hello",
        None,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        ANSWER,
        # The server replays a call's id as Kimi's own (its template answers `Return of <id>`).
        call_id="functions.get_weather:0",
    ),
)

MINIMAX_M2 = Family(
    name="minimax-m2",
    source=LLAMA_CPP + "MiniMax-M2.jinja (the template of MiniMaxAI/MiniMax-M2)",
    config=_moe(
        architectures=["MiniMaxM2ForCausalLM"],
        model_type="minimax",
        head_dim=16,
        num_experts_per_tok=2,
        num_local_experts=4,
        shared_intermediate_size=0,
        rotary_dim=8,
        scoring_func="sigmoid",
        use_qk_norm=True,
    ),
    special=["]~!b[", "]~b]", "[e~["],
    markup=["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"],
    bos="]~!b[",
    eos="[e~[",
    stops=["[e~["],
    pad="[e~[",
    # The generation prompt opens <think>: every answer reasons first.
    prompts=_plain(
        "[e~[",
        "Say hello.\n</think>\n\nhello",
        "2 plus 2 makes 4.\n</think>\n\nThe answer is 4.",
        "Look up the weather.\n</think>\n\n<minimax:tool_call>\n"
        '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n'
        "</minimax:tool_call>",
        "The weather came back.\n</think>\n\n" + ANSWER,
        reasoning_content="Look up the weather.",
    ),
)

GEMMA_4 = Family(
    name="gemma-4",
    source=LLAMA_CPP + "google-gemma-4-31B-it.jinja (the template of google/gemma-4-31B-it)",
    config={
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 32,
            "num_kv_shared_layers": 0,
            "hidden_size_per_layer_input": 0,  # as the 31B: no per-layer input embeddings
            # One sliding-window layer (rotating cache) and one global one; window shrunk so
            # that every prompt overflows it.
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": 131072,
            "use_double_wide_mlp": False,
            "tie_word_embeddings": True,
        },
    },
    special=[
        *("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"),
        *("<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>"),
        *("<tool_response|>", '<|"|>', "<|think|>", "<|image|>", "<|audio|>", "<|video|>"),
    ],
    markup=[],
    bos="<bos>",
    eos="<turn|>",
    stops=["<eos>", "<turn|>", "<|tool_response>"],
    pad="<pad>",
    prompts=_plain(
        "<turn|>",
        "hello",
        "<|channel>thought\n2 plus 2 makes 4.<channel|>The answer is 4.",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        ANSWER,
        call_stop="<|tool_response>",
        think_kwargs={"enable_thinking": True},
    ),
    text_config=True,
)


def _ds(name: str) -> str:
    """A DeepSeek marker: its name between fullwidth bars, words joined by U+2581."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


_DS_END = _ds("end of sentence")

DEEPSEEK_V31 = Family(
    name="deepseek-v3.1",
    # llama.cpp's upstream text before it added `| tojson`: it concatenates `arguments`, so a
    # replayed call's arguments are a string (as the model's own template wants).
    source="https://github.com/ggml-org/llama.cpp/blob/0374c5b6e4c19370262d93e2c3f2a98c9af9fe1f/"
    "models/templates/deepseek-ai-DeepSeek-V3.1.jinja (deepseek-ai/DeepSeek-V3.1)",
    config={**KIMI_K2.config, "architectures": ["DeepseekV3ForCausalLM"]},
    special=[
        _ds(name)
        for name in (
            "begin of sentence",
            "end of sentence",
            "User",
            "Assistant",
            "tool calls begin",
            "tool calls end",
            "tool call begin",
            "tool call end",
            "tool sep",
            "tool output begin",
            "tool output end",
        )
    ],
    markup=["<think>", "</think>"],
    bos=_ds("begin of sentence"),
    eos=_DS_END,
    stops=[_DS_END],
    pad=_DS_END,
    steps=800,
    # Without chat_template_kwargs the server renders DeepSeek in its template's non-thinking
    # mode (the generation prompt closes an empty <think></think>); `thinking` turns it on.
    prompts=_plain(
        _DS_END,
        "hello",
        "2 plus 2 makes 4.</think>The answer is 4.",
        _ds("tool calls begin")
        + _ds("tool call begin")
        + "get_weather"
        + _ds("tool sep")
        + '{"city": "Paris"}'
        + _ds("tool call end")
        + _ds("tool calls end"),
        ANSWER,
        think_kwargs={"thinking": True},
        plain_kwargs={"thinking": False},
        arguments='{"city": "Paris"}',
    ),
)

_QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_QWEN_MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"]
_QWEN_MARKUP.append("</tool_response>")

QWEN3_CODER = Family(
    name="qwen3-coder",
    source=LLAMA_CPP + "Qwen3-Coder.jinja (the template of Qwen/Qwen3-Coder-30B-A3B-Instruct)",
    config=_moe(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    special=_QWEN_SPECIAL,
    markup=_QWEN_MARKUP,
    bos=None,
    eos="<|im_end|>",
    stops=["<|im_end|>", "<|endoftext|>"],
    pad="<|endoftext|>",
    # Qwen3-Coder does not reason.
    prompts=_plain(
        "<|im_end|>",
        "hello",
        None,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>",
        ANSWER,
    ),
)

QWEN3 = Family(
    name="qwen3",
    source=LLAMA_CPP + "Qwen-Qwen3-0.6B.jinja (the template of Qwen/Qwen3-0.6B)",
    config=_moe(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16),
    special=_QWEN_SPECIAL,
    markup=_QWEN_MARKUP,
    bos=None,
    eos="<|im_end|>",
    stops=["<|im_end|>", "<|endoftext|>"],
    pad="<|endoftext|>",
    prompts=_plain(
        "<|im_end|>",
        "<think>\n\n</think>\n\nhello",
        "<think>\n2 plus 2 makes 4.\n</think>\n\nThe answer is 4.",
        "<think>\nLook up the weather.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<think>\n\n</think>\n\n" + ANSWER,
        arguments='{"city": "Paris"}',
        # Qwen3's template keeps the reasoning of a turn after the last user message: the
        # call's, as the server replays it.
        reasoning_content="Look up the weather.",
    ),
)

LFM25 = Family(
    name="lfm2.5",
    source=(
        "https://github.com/ggml-org/llama.cpp/blob/6f4e9f5/models/templates/LFM2.5-8B-A1B.jinja"
        " (the template of LiquidAI/LFM2.5-8B-A1B)"
    ),
    config={
        "architectures": ["Lfm2MoeForCausalLM"],
        "model_type": "lfm2_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128000,
        "use_expert_bias": True,
        "num_dense_layers": 1,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "rope_theta": 1000000.0,
        # Short-convolution layers (recurrent state, not trimmable) between attention ones, as
        # LFM2 alternates them: the prompt cache reuses exact prefixes only.
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "tie_word_embeddings": False,
    },
    special=[
        *("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        *("<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>", "<|tool_call_end|>"),
        *("<|tool_response_start|>", "<|tool_response_end|>"),
    ],
    markup=["<think>", "</think>"],
    bos="<|startoftext|>",
    eos="<|im_end|>",
    stops=["<|im_end|>"],
    pad="<|pad|>",
    prompts=_plain(
        "<|im_end|>",
        "hello",
        "<think>2 plus 2 makes 4.</think>The answer is 4.",
        # Double quotes, as LFM2's model card shows its calls (its template replays them with
        # single ones); a forced call's grammar writes JSON values, the same.
        '<think>Look up the weather.</think><|tool_call_start|>[get_weather(city="Paris")]'
        "<|tool_call_end|>",
        ANSWER,
        # LFM2.5's template keeps the reasoning of a turn after the last user message, under
        # `thinking`.
        thinking="Look up the weather.",
    ),
    # Today's date is in every prompt with tools (the template's `strftime_now`).
    dates=DATES,
)

FAMILIES = {
    f.name: f
    for f in (
        *(GPT_OSS, GLM_46, KIMI_K2, MINIMAX_M2, GEMMA_4, DEEPSEEK_V31, QWEN3_CODER, QWEN3),
        LFM25,
    )
}
