"""Durable state (issue 15), end to end: the SQLite store keeps responses, chains, input items,
replays, conversations and files across a restart and a SIGKILL; background jobs a restart
interrupted end ``failed``; ``--store memory`` forgets everything."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.server import ServerHandle, ServerSettings, serve
from mlx_responses.storage.choice import MEMORY, StoreChoice
from mlx_responses.storage.sqlite import RESTART_MESSAGE
from tests.conformance import assert_strict_response, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings, until_terminal

DEADLINE = 120
HELLO = {"model": MODEL, "input": "Reply with: hello", "temperature": 0}
COUNT = {"model": MODEL, "input": "Count from 1 to 110.", "temperature": 0}
TERMINAL = {"completed", "incomplete", "failed", "cancelled"}
SERVE = [sys.executable, "-m", "mlx_responses.cli", "serve"]


def settings(store: StoreChoice) -> ServerSettings:
    return dataclasses.replace(server_settings(), store=store)


async def _run_server(
    store: StoreChoice, *, task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    await serve(settings(store), task_status=task_status)


class Lifetime:
    """One server process-equivalent: started in its own nursery, stopped by cancelling it
    (no graceful shutdown: nothing more is written than what was acknowledged)."""

    def __init__(self, store: StoreChoice) -> None:
        self.store = store

    async def __aenter__(self) -> ServerHandle:
        self._scope = trio.CancelScope()
        self._done = trio.Event()
        started: list[ServerHandle] = []
        ready = trio.Event()

        async def body() -> None:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    started.append(await nursery.start(_run_server, self.store))
                    ready.set()
            self._done.set()

        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        nursery.start_soon(body)
        with trio.fail_after(START_DEADLINE):
            await ready.wait()
        return started[0]

    async def __aexit__(self, *exc: object) -> None:
        self._scope.cancel()
        await self._nursery_cm.__aexit__(None, None, None)


async def _stream(http: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        raw = b"".join([chunk async for chunk in reply.aiter_bytes()])
    return parse_sse(raw)


async def _replay(http: httpx.AsyncClient, response_id: str) -> list[Any]:
    reply = await http.get(f"/v1/responses/{response_id}?stream=true")
    assert reply.status_code == 200
    return parse_sse(reply.content)


async def _write_everything(http: httpx.AsyncClient) -> dict[str, Any]:
    live = await _stream(http, HELLO)
    first = live[-1][1]["response"]
    second = await http.post("/v1/responses", json={**HELLO, "previous_response_id": first["id"]})
    assert second.status_code == 200, second.text
    conversation = (await http.post("/v1/conversations", json={"metadata": {"k": "v"}})).json()
    turn = await http.post("/v1/responses", json={**HELLO, "conversation": conversation["id"]})
    assert turn.status_code == 200, turn.text
    upload = await http.post(
        "/v1/files",
        files={"file": ("notes.txt", b"durable bytes", "text/plain")},
        data={"purpose": "user_data"},
    )
    assert upload.status_code == 200, upload.text
    return {
        "live": live,
        "first": first,
        "second": second.json(),
        "conversation": conversation,
        "file": upload.json(),
        "items": (await http.get(f"/v1/responses/{second.json()['id']}/input_items")).json(),
        "conv_items": (await http.get(f"/v1/conversations/{conversation['id']}/items")).json(),
    }


async def test_a_restart_keeps_everything(tmp_path: Path) -> None:
    store = StoreChoice("sqlite", str(tmp_path / "store.sqlite3"))
    with trio.fail_after(DEADLINE):
        async with Lifetime(store) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                before = await _write_everything(http)
        async with Lifetime(store) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                first, second = before["first"], before["second"]
                assert (await http.get(f"/v1/responses/{first['id']}")).json() == first
                got = (await http.get(f"/v1/responses/{second['id']}")).json()
                assert got == second
                assert_strict_response(got)
                items = await http.get(f"/v1/responses/{second['id']}/input_items")
                assert items.json() == before["items"]
                assert await _replay(http, first["id"]) == before["live"]
                # The chain continues from a response made before the restart.
                third = await http.post(
                    "/v1/responses", json={**HELLO, "previous_response_id": second["id"]}
                )
                assert third.status_code == 200, third.text
                conv_id = before["conversation"]["id"]
                assert (await http.get(f"/v1/conversations/{conv_id}")).json() == before[
                    "conversation"
                ]
                conv_items = await http.get(f"/v1/conversations/{conv_id}/items")
                assert conv_items.json() == before["conv_items"]
                file_id = before["file"]["id"]
                assert (await http.get(f"/v1/files/{file_id}")).json() == before["file"]
                content = await http.get(f"/v1/files/{file_id}/content")
                assert content.content == b"durable bytes"
                # Deletes are durable too.
                assert (await http.delete(f"/v1/responses/{first['id']}")).status_code == 200
        async with Lifetime(store) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                assert (await http.get(f"/v1/responses/{first['id']}")).status_code == 404
                assert (await http.get(f"/v1/responses/{second['id']}")).status_code == 200


async def test_the_memory_store_forgets_everything_at_restart() -> None:
    with trio.fail_after(DEADLINE):
        async with Lifetime(MEMORY) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                before = await _write_everything(http)
                assert (await http.get(f"/v1/responses/{before['first']['id']}")).status_code == 200
        async with Lifetime(MEMORY) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                for path in (
                    f"/v1/responses/{before['first']['id']}",
                    f"/v1/responses/{before['second']['id']}",
                    f"/v1/conversations/{before['conversation']['id']}",
                    f"/v1/files/{before['file']['id']}",
                ):
                    assert (await http.get(path)).status_code == 404, path


async def test_an_interrupted_job_ends_failed_after_a_restart(tmp_path: Path) -> None:
    store = StoreChoice("sqlite", str(tmp_path / "store.sqlite3"))
    job = {**COUNT, "background": True, "max_output_tokens": 2000}
    with trio.fail_after(DEADLINE):
        async with Lifetime(store) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                created = (await http.post("/v1/responses", json=job)).json()
                assert created["status"] == "queued"
                done = await http.post("/v1/responses", json={**HELLO, "background": True})
                done_id = done.json()["id"]
                await until_terminal(http, done_id)
                # The long job is still running when the server goes away.
                assert (await http.get(f"/v1/responses/{created['id']}")).json()["status"] in (
                    "queued",
                    "in_progress",
                )
        async with Lifetime(store) as server:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
                failed = (await http.get(f"/v1/responses/{created['id']}")).json()
                finished = (await http.get(f"/v1/responses/{done_id}")).json()
                stream = await _replay(http, created["id"])
                cancel = await http.post(f"/v1/responses/{created['id']}/cancel")
    assert_strict_response(failed)
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": RESTART_MESSAGE}
    assert finished["status"] == "completed"  # a finished job is not touched
    assert [name for name, _ in stream] == [
        "response.created",
        "response.queued",
        "response.failed",
    ]
    assert cancel.status_code == 400  # it has finished


# -- a real process, killed -------------------------------------------------------------------


class Cli:
    """``mlx-responses serve`` in a child process on a free port."""

    def __init__(self, store: str, data_home: Path) -> None:
        self.store = store
        self.env = {**os.environ, "XDG_DATA_HOME": str(data_home)}

    async def start(self, nursery: trio.Nursery) -> str:
        command = [sys.executable, "-m", "mlx_responses.cli", "serve", "--port", "0"]
        if self.store:
            command += ["--store", self.store]
        self.process = await trio.lowlevel.open_process(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=self.env
        )
        assert self.process.stderr is not None
        seen = b""
        url: str | None = None
        with trio.fail_after(START_DEADLINE):
            while url is None:
                chunk = await self.process.stderr.receive_some()
                assert chunk, f"the server exited: {seen.decode(errors='replace')}"
                seen += chunk
                found = re.search(rb" at (http://[0-9.:]+)", seen)
                url = found.group(1).decode() if found else None
        nursery.start_soon(self._drain)
        return url

    async def _drain(self) -> None:
        assert self.process.stderr is not None
        while await self.process.stderr.receive_some():
            pass

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()


@pytest.mark.parametrize("store", ["", "sqlite:{tmp}/elsewhere.sqlite3"])
async def test_sigkill_loses_no_acknowledged_write(tmp_path: Path, store: str) -> None:
    """The command line's default store is durable: every create answered before a kill -9
    is there after a restart, and a job it interrupted has ended ``failed``."""
    cli = Cli(store.format(tmp=tmp_path), tmp_path / "data")
    with trio.fail_after(DEADLINE * 2):
        async with trio.open_nursery() as nursery:
            url = await cli.start(nursery)
            acknowledged: list[dict[str, Any]] = []
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                job = (
                    await http.post(
                        "/v1/responses",
                        json={**COUNT, "background": True, "max_output_tokens": 2000},
                    )
                ).json()

                async def create() -> None:
                    reply = await http.post("/v1/responses", json=HELLO)
                    assert reply.status_code == 200
                    acknowledged.append(reply.json())

                async with trio.open_nursery() as creates:
                    for _ in range(12):
                        creates.start_soon(create)
                before = await _write_everything(http)  # a chain, a conversation, a file
                seen = (await http.get(f"/v1/responses/{job['id']}")).json()
            await cli.kill()
            nursery.cancel_scope.cancel()
        if not store:
            assert (tmp_path / "data" / "mlx-responses" / "store.sqlite3").exists()
        async with trio.open_nursery() as nursery:
            url = await cli.start(nursery)
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                for response in acknowledged:
                    got = await http.get(f"/v1/responses/{response['id']}")
                    assert got.json() == response
                second_id = before["second"]["id"]
                assert (await http.get(f"/v1/responses/{second_id}")).json() == before["second"]
                items = await http.get(f"/v1/responses/{second_id}/input_items")
                assert items.json() == before["items"]
                conv_id = before["conversation"]["id"]
                conv_items = await http.get(f"/v1/conversations/{conv_id}/items")
                assert conv_items.json() == before["conv_items"]
                content = await http.get(f"/v1/files/{before['file']['id']}/content")
                assert content.content == b"durable bytes"
                failed = (await http.get(f"/v1/responses/{job['id']}")).json()
            await cli.kill()
            nursery.cancel_scope.cancel()
    assert len(acknowledged) == 12
    if seen["status"] in TERMINAL:  # pragma: no cover - the job beat the kill on a fast machine
        assert failed == seen
    else:
        assert failed["status"] == "failed"
        assert failed["error"]["message"] == RESTART_MESSAGE


async def test_a_second_server_on_the_same_file_stops_with_a_message(tmp_path: Path) -> None:
    cli = Cli(f"sqlite:{tmp_path}/one.sqlite3", tmp_path / "data")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await cli.start(nursery)
            second = await trio.run_process(
                [*SERVE, "--port", "0", "--store", f"sqlite:{tmp_path}/one.sqlite3"],
                capture_stderr=True,
                check=False,
                env=cli.env,
            )
            await cli.kill()
            nursery.cancel_scope.cancel()
    assert second.returncode == 1
    assert b"is in use by another mlx-responses server" in second.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("postgresql://", "needs a host or a database"),
        ("sqlite:", "needs a file path"),
        ("redis://x", "--store must be"),
    ],
)
def test_an_unusable_store_flag_stops_start_up(value: str, message: str) -> None:
    from mlx_responses.cli import build_parser, settings_from_args

    with pytest.raises(SystemExit, match=message):
        settings_from_args(build_parser({}).parse_args(["serve", "--store", value]))


def test_the_default_store_is_sqlite_in_the_user_data_folder() -> None:
    from mlx_responses.cli import build_parser, settings_from_args
    from mlx_responses.storage.choice import default_data_dir

    env = {"XDG_DATA_HOME": "/x/share", "HOME": "/home/u"}
    if sys.platform != "darwin":
        assert default_data_dir(env) == "/x/share/mlx-responses"
        assert default_data_dir({"HOME": "/home/u"}) == "/home/u/.local/share/mlx-responses"
    settings = settings_from_args(build_parser({}).parse_args(["serve"]))
    assert settings.store == StoreChoice(
        "sqlite", os.path.join(default_data_dir(), "store.sqlite3")
    )
    from_env = build_parser({"MLX_RESPONSES_STORE": "memory"}).parse_args(["serve"])
    assert settings_from_args(from_env).store == MEMORY
    flag = build_parser({}).parse_args(["serve", "--data-dir", "/d", "--store", "sqlite"])
    assert settings_from_args(flag).store == StoreChoice("sqlite", "/d/store.sqlite3")
