"""`make conformance`: real clients against a real server with the bundled model.

What it runs (docs/clients.md, "Conformance"):
1. `mlx-responses serve` on a free port (bundled model, `--unsupported-tools drop`,
   `--default-temperature 0` (Codex sends no temperature), a 4096-token
   window: Codex's prompt with the MCP server is ~1,900 tokens of the bundled model's vocabulary).
2. llm-comply (PyPI, pinned in pyproject's test extras) in the `open-responses` and `anthropic`
   formats. A failure passes only when it is one of the named, documented cases in
   ``EXPECTED_FAILURES`` (model capability, or a documented difference from Open Responses).
3. Codex CLI (npm, pinned in conformance/package-lock.json, installed by `npm ci`):
   `codex exec --skip-git-repo-check --json` with its smallest prompt profile (no environment
   context, no permissions, apps or skills instructions, no web search and no shell tool) must
   complete a turn (`turn.completed`) against the server and answer "hello".

4. The OpenAI Agents SDK (pinned in the test extras) runs its tool loop: the model calls
   `get_weather`, the SDK runs the tool and sends its output back, the model answers
   ("It is sunny and 18 degrees in Paris.": the bundled model's documented tool prompts).
5. Codex's MCP tool round trip: with one MCP server (conformance/weather_mcp.py), "What is the
   weather in Paris?" must make the model call `mcp__weather__get_weather` (a `function_call`
   with `namespace`), Codex run it and send its output back, and the model answer: a completed
   `mcp_tool_call` item, an agent message, `turn.completed`. The bundled model is trained on
   exactly these Codex turns: scripts/codex_prompts.json holds the server's rendering of Codex's
   captured requests (scripts/codex_prompts.py), and scripts/build_tiny_model.py trains on them
   and writes what it checked to src/engine/bundled/codex_prompts.json (docs/bundled-model.md).
   Without that file (a model built without them) the check is listed under `not_run`.

6. The Open Responses WebSocket compliance tests (7; the upstream suite runs on Bun, llm-comply
   has none): equivalent checks of the same names and rules, tests/websocket_compliance.py.

7. Codex's MCP round trip on the gpt-oss fixture (tests/fixtures/families/gpt-oss, harmony):
   a second server (`--model` the fixture, `--alias gpt-oss-tiny`), the same `codex exec` run
   and the same requirements as 5. The fixture is trained on the server's rendering of the same
   captured requests with its template (scripts/build_family_fixtures.py, `Family.codex` in
   scripts/family_specs.py): the first turn answers with harmony's call
   `<|channel|>commentary to=functions.mcp__weather__get_weather <|constrain|>json<|message|>`,
   the follow-up on the `final` channel. Without the fixture's codex_prompts.json the check is
   listed under `not_run`.

8. Images on the vision fixture (tests/fixtures/vision/qwen2-vl, a tiny trained Qwen2-VL,
   docs/vision.md): a third server (`--model` the fixture, `--alias qwen2-vl-tiny`) and
   llm-comply's image tests only, which must pass there: `image-input` (open-responses) and
   `anth-image-input` (anthropic, which also requires the answer to end: the fixture is trained
   to describe the suite's photo briefly, scripts/build_vision_fixture.py).

9. Codex's `view_image` round trip on the Qwen3-VL fixture (tests/fixtures/vision/qwen3-vl, a
   tiny Qwen3-VL whose template has tools, docs/vision.md): a fourth server (`--model` the
   fixture, `--alias qwen3-vl-tiny`), `codex exec` with the small profile but `view_image = true`
   under `[features]`, a 56x56 solid blue square.png in Codex's working directory, and "What
   colour is the square in square.png?". Required: `turn.completed` and no error event (the
   fallback-metadata notice is an `error` *item*, not counted, as in every Codex check); Codex's
   own session record (its rollout file: Codex's JSON output shows no item for view_image)
   holds exactly one function call, `view_image`, and one function_call_output holding an
   `input_image`; the server's log shows two `POST /v1/responses` (the call, then the answer),
   both 200; the agent message is `blue`. The fixture is trained on the server's rendering of
   Codex's captured view_image requests (tests/fixtures/codex-0.171.0-small-view-image-*.json);
   when its prompts.json lists no `codex_` prompt the check is listed under `not_run`.

10. The OpenAI Agents SDK's hosted tools (scripts/conformance_hosted.py): a fifth server on the
   trained hosted-tools fixture (tests/fixtures/hosted_model) with `--web-search local` over
   tests/fixtures/web_index and `--mcp-allow-hosts 127.0.0.1 --mcp-allow-private`, and the
   `mcp` package's own server (tests/mcp_servers.py) started by the run: `WebSearchTool` must
   end in the fixture's cited answer after a `web_search_call`, `HostedMCPTool` in "It is
   sunny, 18C in Paris." after an `mcp_call`.

Exit status 0 when every check passed; a summary per client is printed as JSON and written to
conformance/results/summary.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from conformance_hosted import hosted_checks  # noqa: E402

VENV_BIN = Path(sys.executable).parent
CODEX = ROOT / "conformance" / "node_modules" / ".bin" / "codex"
RESULTS = ROOT / "conformance" / "results"
MODEL = "mlx-responses-tiny"
CONTEXT = 4096
START_DEADLINE = 90
RUN_DEADLINE = 300

# llm-comply test id -> why it fails here (docs/clients.md lists the same cases).
EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "open-responses": {
        "image-input": "model capability: the bundled model is text-only (input_image is a 400)",
        "compact-response": "spec 000: a history too short to shorten is a 400, not a compaction",
        "response-output-phase-schema": "model capability: 'Say one word.' is not one of the "
        "bundled model's documented prompts; whether its greedy answer stops depends on the "
        "weights (when not, the response ends incomplete at the context window)",
    },
    "anthropic": {
        "anth-image-input": "model capability: the bundled model is text-only (image is a 400)",
    },
}
# Spec 000 (decision 21): a foreground response has no `background` key; Open Responses requires
# one. The server runs with `--background-key always` (issue 28), so none is ignored.
IGNORED_ERRORS: dict[str, list[str]] = {"open-responses": [], "anthropic": []}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not become ready in time")


def llm_comply(
    fmt: str, base: str, model: str = MODEL, only: list[str] | None = None
) -> dict[str, Any]:
    """llm-comply's tests in format ``fmt``; ``only`` runs those test ids alone, and then every
    one of them must pass (no documented failures)."""
    command = [str(VENV_BIN / "llm-comply"), "--format", fmt, "-u", f"{base}/v1", "-k", "local"]
    command += ["-m", model, "--json"]
    if only:
        command += ["-f", ",".join(only)]
    if fmt == "anthropic":
        command += [
            "--auth-header",
            "x-api-key",
            "--no-bearer",
            "-H",
            "anthropic-version:2023-06-01",
        ]
    for pattern in IGNORED_ERRORS[fmt]:
        command += ["-i", pattern]
    run = subprocess.run(command, capture_output=True, text=True, timeout=RUN_DEADLINE, check=False)
    try:
        report = json.loads(run.stdout)
    except ValueError:
        return {
            "ok": False,
            "error": f"llm-comply printed no JSON: {run.stdout[-500:]}{run.stderr[-500:]}",
        }
    expected = {} if only else EXPECTED_FAILURES[fmt]
    results = report["results"]
    failed = [r for r in results if r["status"] == "failed"]
    unexpected = [r for r in failed if r["id"] not in expected]
    missing = sorted(set(only or []) - {r["id"] for r in results if r["status"] == "passed"})
    return {
        "ok": not unexpected and not missing,
        "passed": sum(r["status"] == "passed" for r in results),
        "failed": len(failed),
        "skipped": sum(r["status"] == "skipped" for r in results),
        "total": len(results),
        "documented_failures": {r["id"]: expected[r["id"]] for r in failed if r["id"] in expected},
        "skipped_tests": {
            r["id"]: (r.get("errors") or [""])[0][:200] for r in results if r["status"] == "skipped"
        },
        "unexpected_failures": {r["id"]: r.get("errors", []) for r in unexpected},
        **({"not_passed": missing} if only else {}),
    }


# Codex's smallest prompt: with `shell_tool = false` Codex offers no exec_command / write_stdin
# (1,300 of the bundled model's tokens); the MCP round trip needs neither. The bundled model is
# trained on the requests this profile makes (tests/fixtures/codex-0.169.0-small-*.json).
# The small profile's settings, shared by both ways of pointing Codex at the server.
CODEX_SMALL = """\
model_instructions_file = "{instructions}"
include_permissions_instructions = false
include_environment_context = false
include_apps_instructions = false
web_search = "disabled"
{extra}
[features]
goals = false
view_image = {view_image}
shell_tool = false

[skills]
include_instructions = false

[agents]
enabled = false
"""
CODEX_PROFILE = (
    """\
model = "{model}"
model_provider = "mlx"
"""
    + CODEX_SMALL
    + """
[model_providers.mlx]
name = "mlx-responses"
base_url = "{base}/v1"
env_key = "MLX_RESPONSES_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
)

# One MCP server: Codex sends its tools as the namespace tool `mcp__weather`.
CODEX_MCP = """
[mcp_servers.weather]
command = "{python}"
args = ["{server}"]
default_tools_approval_mode = "approve"
"""
MCP_SERVER = ROOT / "conformance" / "weather_mcp.py"
# The bundled model's Codex turns (scripts/build_tiny_model.py); without them it never calls a
# tool under Codex's prompt.
CODEX_TRAINED = ROOT / "src" / "engine" / "bundled" / "codex_prompts.json"
# The gpt-oss family fixture, trained on the same Codex turns in harmony (docs/models.md).
GPT_OSS = ROOT / "tests" / "fixtures" / "families" / "gpt-oss"
GPT_OSS_MODEL = "gpt-oss-tiny"
# The vision fixture: a tiny Qwen2-VL trained on coloured squares and llm-comply's photo.
VISION = ROOT / "tests" / "fixtures" / "vision" / "qwen2-vl"
VISION_MODEL = "qwen2-vl-tiny"
# The Qwen3-VL fixture: its template has tools, and it is trained on Codex's view_image turns.
VISION_CODEX = ROOT / "tests" / "fixtures" / "vision" / "qwen3-vl"
VISION_CODEX_MODEL = "qwen3-vl-tiny"


def codex_exec(
    base: str,
    prompt: str,
    *,
    mcp: bool,
    model: str = MODEL,
    view_image: bool = False,
    files: dict[str, bytes] | None = None,
    rollout: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """``codex exec --json`` with the smallest profile, asking for ``model``; its JSON
    events. ``view_image`` turns Codex's image tool on, ``files`` are written to its working
    directory first, and ``rollout`` receives the items of Codex's own session record (what it
    sent the model, tool outputs included)."""
    with tempfile.TemporaryDirectory(prefix="codex-home-", dir=RESULTS) as home:
        instructions = Path(home) / "instructions.md"
        instructions.write_text("You are a coding agent. Use the tools when asked.\n")
        profile = CODEX_PROFILE.format(
            model=model,
            instructions=instructions,
            base=base,
            extra="",
            view_image="true" if view_image else "false",
        )
        if mcp:
            profile += CODEX_MCP.format(python=sys.executable, server=MCP_SERVER)
        (Path(home) / "small.config.toml").write_text(profile)
        work = Path(home) / "work"
        work.mkdir()
        for name, data in (files or {}).items():
            (work / name).write_bytes(data)
        env = {**os.environ, "CODEX_HOME": home, "MLX_RESPONSES_KEY": "local"}
        command = [str(CODEX), "exec", "-p", "small", "--skip-git-repo-check", "--json"]
        run = subprocess.run(
            [*command, prompt],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_DEADLINE,
            check=False,
        )
        if rollout is not None:
            rollout.extend(_rollout_items(Path(home)))
    return _json_lines(run.stdout, run.returncode, run.stderr)


def _rollout_items(home: Path) -> list[dict[str, Any]]:
    """The response items of Codex's session record(s) under ``home`` (``sessions/**/
    rollout-*.jsonl``: one JSON line per event; ``response_item`` lines hold the items)."""
    items: list[dict[str, Any]] = []
    for path in sorted(home.glob("sessions/**/rollout-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("type") == "response_item":
                payload = record.get("payload")
                if isinstance(payload, dict):
                    items.append(payload)
    return items


# Codex with its built-in `openai` provider and only the base URL changed (issue 28): it talks
# over the WebSocket (a warm-up, then turns continuing it) and compacts remotely with a
# `compaction_trigger` create. The same small profile as above, without a provider entry.
CODEX_BUILTIN_PROFILE = (
    """\
model = "{model}"
openai_base_url = "{base}/v1"
"""
    + CODEX_SMALL
)


def codex_builtin(
    base: str, prompts: list[str], *, mcp: bool = False, compact_limit: int | None = None
) -> list[list[dict[str, Any]]]:
    """``codex exec --json`` with the built-in provider, logged in with an API key (``codex
    login --with-api-key``); each prompt after the first resumes the same thread. The JSON
    events of each run."""
    runs: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="codex-home-", dir=RESULTS) as home:
        instructions = Path(home) / "instructions.md"
        instructions.write_text("You are a coding agent. Use the tools when asked.\n")
        extra = (
            "" if compact_limit is None else f"model_auto_compact_token_limit = {compact_limit}\n"
        )
        profile = CODEX_BUILTIN_PROFILE.format(
            model=MODEL, instructions=instructions, base=base, extra=extra, view_image="false"
        )
        if mcp:
            profile += CODEX_MCP.format(python=sys.executable, server=MCP_SERVER)
        (Path(home) / "config.toml").write_text(profile)
        work = Path(home) / "work"
        work.mkdir()
        env = {**os.environ, "CODEX_HOME": home}
        subprocess.run(
            [str(CODEX), "login", "--with-api-key"],
            input="local\n",
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=RUN_DEADLINE,
            check=True,
        )
        for number, prompt in enumerate(prompts):
            command = [str(CODEX), "exec", "--skip-git-repo-check", "--json"]
            if number:
                command += ["resume", "--last"]
            run = subprocess.run(
                [*command, prompt],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=RUN_DEADLINE,
                check=False,
            )
            runs.append(_json_lines(run.stdout, run.returncode, run.stderr))
    return runs


def _json_lines(stdout: str, returncode: int, stderr: str) -> list[dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    if returncode and not events:
        events.append({"type": "error", "message": stderr[-500:]})
    return events


def socket_lines(log_path: Path, start: int) -> list[dict[str, Any]]:
    """The server's WebSocket request-log lines written after byte ``start`` of its log."""
    with log_path.open("rb") as log:
        log.seek(start)
        text = log.read().decode("utf-8", "replace")
    lines = []
    for line in text.splitlines():
        _, found, rest = line.partition("request ")
        if found and '"method":"WS"' in rest:
            lines.append(json.loads(rest))
    return lines


def _creates(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == "response.create"]


def codex_builtin_turn(base: str, log_path: Path) -> dict[str, Any]:
    """One turn with the built-in provider, over the socket."""
    start = log_path.stat().st_size
    (events,) = codex_builtin(base, ["Reply with: hello"])
    kinds = [event.get("type") for event in events]
    messages = [item.get("text") for item in _items(events, "agent_message")]
    creates = _creates(socket_lines(log_path, start))
    return {
        "ok": "turn.completed" in kinds
        and not _errors(events)
        and messages == ["hello"]
        and bool(creates)
        and all(c["status"] == 200 for c in creates),
        "events": kinds,
        "agent_messages": messages,
        "socket_creates": [(c["status"], c["response_status"]) for c in creates],
        "errors": _errors(events),
    }


def codex_builtin_tool_round_trip(base: str, log_path: Path) -> dict[str, Any]:
    """The MCP round trip with the built-in provider, over the socket."""
    start = log_path.stat().st_size
    (events,) = codex_builtin(base, ["What is the weather in Paris?"], mcp=True)
    calls = _items(events, "mcp_tool_call")
    messages = [item.get("text") for item in _items(events, "agent_message")]
    kinds = [event.get("type") for event in events]
    creates = _creates(socket_lines(log_path, start))
    ok = (
        "turn.completed" in kinds
        and not _errors(events)
        and any(
            call.get("status") == "completed" and call.get("arguments") == {"city": "Paris"}
            for call in calls
        )
        and bool(messages)
        and len(creates) >= 3  # warm-up, the call, the answer: all over the socket
    )
    return {
        "ok": ok,
        "events": kinds,
        "agent_messages": messages,
        "socket_creates": [(c["status"], c["response_status"]) for c in creates],
        "errors": _errors(events),
    }


def codex_builtin_remote_compaction(base: str, log_path: Path) -> dict[str, Any]:
    """A remote compaction forced by a small ``model_auto_compact_token_limit``: the second
    turn compacts the first (a ``compaction_trigger`` create answered with one compaction
    item), then continues from the compacted history and completes."""
    start = log_path.stat().st_size
    first, second = codex_builtin(
        base, ["Reply with: hello", "Reply with: hello"], compact_limit=600
    )
    kinds = [[event.get("type") for event in run] for run in (first, second)]
    messages = [item.get("text") for item in _items(second, "agent_message")]
    lines = socket_lines(log_path, start)
    compactions = [c for c in _creates(lines) if c.get("output") == ["compaction"]]
    return {
        "ok": all("turn.completed" in k for k in kinds)
        and not _errors(first)
        and not _errors(second)
        and bool(messages)
        and len(compactions) == 1
        and compactions[0]["status"] == 200,
        "events": kinds,
        "agent_messages": messages,
        "compactions": compactions,
        "errors": _errors(first) + _errors(second),
    }


def _items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        e["item"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == kind
    ]


def _errors(events: list[dict[str, Any]]) -> list[Any]:
    return [
        e.get("message") or e.get("error")
        for e in events
        if e.get("type") in ("error", "turn.failed")
    ]


def codex_turn(base: str) -> dict[str, Any]:
    """One turn completes."""
    if not CODEX.exists():
        return {"ok": False, "error": f"{CODEX} is missing: run `npm ci` in conformance/"}
    events = codex_exec(base, "Reply with: hello", mcp=False)
    kinds = [event.get("type") for event in events]
    messages = [item.get("text") for item in _items(events, "agent_message")]
    return {
        "ok": "turn.completed" in kinds and not _errors(events) and messages == ["hello"],
        "events": kinds,
        "agent_messages": messages,
        "errors": _errors(events),
    }


def codex_tool_round_trip(base: str, model: str = MODEL) -> dict[str, Any]:
    """The model calls the MCP tool (a namespaced function_call), Codex runs it on its MCP
    server and sends the output back, the model answers: one turn, two requests."""
    if not CODEX.exists():
        return {"ok": False, "error": f"{CODEX} is missing: run `npm ci` in conformance/"}
    events = codex_exec(base, "What is the weather in Paris?", mcp=True, model=model)
    calls = _items(events, "mcp_tool_call")
    messages = [item.get("text") for item in _items(events, "agent_message")]
    kinds = [event.get("type") for event in events]
    ok = (
        "turn.completed" in kinds
        and not _errors(events)
        and any(
            call.get("status") == "completed" and call.get("arguments") == {"city": "Paris"}
            for call in calls
        )
        and bool(messages)
    )
    return {
        "ok": ok,
        "events": kinds,
        "mcp_tool_calls": [
            {k: call.get(k) for k in ("server", "tool", "arguments", "status")} for call in calls
        ],
        "agent_messages": messages,
        "errors": _errors(events),
    }


def _square_png(rgb: tuple[int, int, int], side: int = 56) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side), rgb).save(buffer, "PNG")
    return buffer.getvalue()


def _posts(log_path: Path, start: int) -> list[int]:
    """The statuses of the ``POST /v1/responses`` request-log lines after byte ``start``."""
    with log_path.open("rb") as log:
        log.seek(start)
        text = log.read().decode("utf-8", "replace")
    statuses = []
    for line in text.splitlines():
        _, found, rest = line.partition("request ")
        if found and rest.startswith("{"):
            entry = json.loads(rest)
            if (entry.get("method"), entry.get("path")) == ("POST", "/v1/responses"):
                statuses.append(int(entry["status"]))
    return statuses


def _image_outputs(rollout: list[dict[str, Any]]) -> list[str]:
    """The ``function_call_output`` items of Codex's record whose output holds an
    ``input_image`` (a data URL): the view_image result it sent back."""
    found = []
    for item in rollout:
        output = item.get("output") if item.get("type") == "function_call_output" else None
        parts = output if isinstance(output, list) else []
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "input_image":
                found.append(str(part.get("image_url", ""))[:22])
    return found


def codex_view_image(base: str, log_path: Path) -> dict[str, Any]:
    """Codex's ``view_image`` round trip (issue 27): a 56x56 blue square.png in its working
    directory, "What colour is the square in square.png?"; the model calls view_image, Codex
    reads the file and sends it back as an ``input_image`` in the call's output (a second
    POST), and the model answers the colour."""
    if not CODEX.exists():
        return {"ok": False, "error": f"{CODEX} is missing: run `npm ci` in conformance/"}
    start = log_path.stat().st_size
    rollout: list[dict[str, Any]] = []
    events = codex_exec(
        base,
        "What colour is the square in square.png?",
        mcp=False,
        model=VISION_CODEX_MODEL,
        view_image=True,
        files={"square.png": _square_png((0, 0, 255))},
        rollout=rollout,
    )
    kinds = [event.get("type") for event in events]
    messages = [item.get("text") for item in _items(events, "agent_message")]
    calls = [
        (item.get("name"), item.get("arguments"))
        for item in rollout
        if item.get("type") == "function_call"
    ]
    images = _image_outputs(rollout)
    posts = _posts(log_path, start)
    ok = (
        "turn.completed" in kinds
        and not _errors(events)
        and [name for name, _ in calls] == ["view_image"]
        and len(images) == 1
        and images[0].startswith("data:image/")
        and posts == [200, 200]
        and messages == ["blue"]
    )
    return {
        "ok": ok,
        "events": kinds,
        "function_calls": calls,
        "image_outputs": images,
        "responses_posts": posts,
        "agent_messages": messages,
        "errors": _errors(events),
    }


# The bundled model's documented tool prompts (docs/bundled-model.md): the same tool, the same
# tool output, so the Agents SDK's loop renders exactly the documented `tool_call` and
# `tool_result` prompts.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The name of the city."}},
    "required": ["city"],
}
WEATHER_RESULT = '{"city": "Paris", "temperature": 18, "condition": "sunny"}'


def agents_tool_loop(base: str) -> dict[str, Any]:
    """The OpenAI Agents SDK runs its tool loop: the model calls get_weather, the SDK runs it,
    sends the output back, and the model answers."""
    import asyncio

    from agents import Agent, FunctionTool, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[Any] = []

    async def invoke(_ctx: Any, arguments: str) -> str:
        calls.append(json.loads(arguments))
        return WEATHER_RESULT

    tool = FunctionTool(
        name="get_weather",
        description="Get the current weather in a city.",
        params_json_schema=WEATHER_SCHEMA,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )

    async def run() -> str:
        async with AsyncOpenAI(base_url=f"{base}/v1", api_key="local", max_retries=0) as client:
            model = OpenAIResponsesModel(model=MODEL, openai_client=client)
            agent = Agent(name="weather", model=model, tools=[tool])
            result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
            return str(result.final_output)

    try:
        answer = asyncio.run(asyncio.wait_for(run(), RUN_DEADLINE))
    except Exception as exc:  # any SDK error is this check's failure, reported
        return {"ok": False, "tool_calls": calls, "error": repr(exc)[:500]}
    expected = "It is sunny and 18 degrees in Paris."
    return {
        "ok": calls == [{"city": "Paris"}] and answer == expected,
        "tool_calls": calls,
        "final_output": answer,
    }


def websocket_checks(base: str) -> dict[str, Any]:
    """The Open Responses WebSocket tests as equivalent checks (issue 14)."""
    sys.path.insert(0, str(ROOT))  # tests/ is a package of the repository, not installed
    from tests.websocket_compliance import run_checks

    return run_checks(base, "local", MODEL, background_key=True)  # the server's --background-key


@contextlib.contextmanager
def serving(extra: list[str], log_name: str) -> Iterator[str]:
    """``mlx-responses serve`` on a free port with Codex's settings and ``extra`` arguments,
    logging to ``RESULTS/log_name``; yields its base URL and stops it afterwards."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data_dir = tempfile.mkdtemp(prefix="data-", dir=RESULTS)
    env = {**os.environ, "MLX_RESPONSES_DATA_DIR": data_dir}
    log = (RESULTS / log_name).open("wb")
    server = subprocess.Popen(
        [
            str(VENV_BIN / "mlx-responses"),
            "serve",
            "--port",
            str(port),
            "--ctx-size",
            str(CONTEXT),
            "--unsupported-tools",
            "drop",
            # Codex never sends a temperature: greedy answers make its turn reproducible.
            "--default-temperature",
            "0",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_ready(base, server)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def gpt_oss_checks(summary: dict[str, Any]) -> None:
    """Codex's MCP round trip on the gpt-oss fixture (harmony), on a server of its own."""
    name = "codex exec on the gpt-oss fixture (MCP tool round trip)"
    if not (GPT_OSS / "codex_prompts.json").exists():
        summary.setdefault("not_run", {})[name] = (
            f"the gpt-oss fixture was not trained on Codex's prompt ({GPT_OSS}/codex_prompts.json "
            "is missing)"
        )
        return
    extra = ["--model", str(GPT_OSS), "--alias", GPT_OSS_MODEL]
    with serving(extra, "server-gpt-oss.log") as base:
        summary[name] = codex_tool_round_trip(base, GPT_OSS_MODEL)


def vision_checks(summary: dict[str, Any]) -> None:
    """llm-comply's image tests on the vision fixture, on a server of its own (issue 27)."""
    # Open Responses requires `background` on every Response (issue 28), as for the main server.
    extra = ["--model", str(VISION), "--alias", VISION_MODEL, "--background-key", "always"]
    with serving(extra, "server-vision.log") as base:
        summary["llm-comply open-responses image-input (vision fixture)"] = llm_comply(
            "open-responses", base, VISION_MODEL, ["image-input"]
        )
        summary["llm-comply anthropic anth-image-input (vision fixture)"] = llm_comply(
            "anthropic", base, VISION_MODEL, ["anth-image-input"]
        )


def view_image_checks(summary: dict[str, Any]) -> None:
    """Codex's view_image round trip on the Qwen3-VL fixture, on a server of its own."""
    name = "codex exec on the qwen3-vl fixture (view_image round trip)"
    trained = VISION_CODEX / "prompts.json"
    records = json.loads(trained.read_text()) if trained.exists() else []
    if not any(str(r.get("name", "")).startswith("codex_") for r in records):
        summary.setdefault("not_run", {})[name] = (
            f"the qwen3-vl fixture was not trained on Codex's view_image turns ({trained} lists "
            "no codex_ prompt)"
        )
        return
    extra = ["--model", str(VISION_CODEX), "--alias", VISION_CODEX_MODEL]
    with serving(extra, "server-vision-codex.log") as base:
        summary[name] = codex_view_image(base, RESULTS / "server-vision-codex.log")


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    # Open Responses requires `background` on every Response (issue 28).
    with serving(["--background-key", "always"], "server.log") as base:
        summary: dict[str, Any] = {
            "llm-comply open-responses": llm_comply("open-responses", base),
            "llm-comply anthropic": llm_comply("anthropic", base),
            "codex exec (one turn)": codex_turn(base),
            "openai-agents (tool loop)": agents_tool_loop(base),
            "open-responses websocket (7 checks)": websocket_checks(base),
        }
        if CODEX_TRAINED.exists():
            summary["codex exec (MCP tool round trip)"] = codex_tool_round_trip(base)
            log_path = RESULTS / "server.log"
            summary["codex built-in provider (one turn)"] = codex_builtin_turn(base, log_path)
            summary["codex built-in provider (MCP tool round trip)"] = (
                codex_builtin_tool_round_trip(base, log_path)
            )
            summary["codex built-in provider (remote compaction)"] = (
                codex_builtin_remote_compaction(base, log_path)
            )
        else:
            summary["not_run"] = {
                "codex tool round trip": "the bundled model was not trained on Codex's prompt "
                f"({CODEX_TRAINED} is missing)"
            }
    gpt_oss_checks(summary)
    vision_checks(summary)
    view_image_checks(summary)
    hosted_checks(summary, serving)  # scripts/conformance_hosted.py
    text = json.dumps(summary, indent=2)
    (RESULTS / "summary.json").write_text(text + "\n")
    print(text)
    checks = [value for key, value in summary.items() if key != "not_run"]
    passed = sum(bool(check["ok"]) for check in checks)
    print(f"conformance: {passed} passed, {len(checks) - passed} failed")
    return 0 if passed == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
