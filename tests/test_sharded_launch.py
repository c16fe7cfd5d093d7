"""The documented start (issue 26, docs/distributed.md): ``mlx.launch --backend ring -n 2 --
mlx-responses serve`` serves the bundled model split over 2 local ranks, answers through the
openai SDK as one process does, and SIGTERM to rank 0 ends every rank and the launcher with 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from openai import OpenAI

from mlx_responses.engine.bundled_model import load_bundled_prompts

from .conftest import MODEL
from .sharded import free_port

LAUNCH = Path(sys.executable).with_name("mlx.launch")
DEADLINE = 120
CAPITAL = next(p for p in load_bundled_prompts() if p.name == "capital")


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for task in tasks.iterdir() for c in (task / "children").read_text().split()]


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (rank,) = [line.split(b"=", 1)[1] for line in environ if line.startswith(b"MLX_RANK=")]
    return int(rank)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the ranks in /proc")
def test_mlx_launch_serves_and_every_rank_exits_0_after_sigterm(tmp_path: Path) -> None:
    command = [str(LAUNCH), "--backend", "ring", "-n", "2", "--starting-port", str(free_port(2))]
    command += ["--", "mlx-responses", "serve", "--port", "0", "--store", "memory"]
    env = {"PATH": f"{LAUNCH.parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    launcher = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines: list[str] = []
    served = threading.Event()

    def pump() -> None:
        assert launcher.stdout is not None
        for raw in iter(launcher.stdout.readline, b""):
            lines.append(raw.decode(errors="replace"))
            if "serving " in lines[-1]:
                served.set()
        served.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert served.wait(DEADLINE), "".join(lines)
        found = re.search(r"serving \S+ at (http://[\d.:]+)", "".join(lines))
        assert found, "".join(lines)
        client = OpenAI(
            base_url=f"{found.group(1)}/v1", api_key="x", max_retries=0, timeout=DEADLINE
        )
        with client:
            answer = client.responses.create(
                model=MODEL,
                input=[dict(m) for m in CAPITAL.messages],  # type: ignore[misc]
                temperature=0,
            )
        ranks = {_rank_of(pid): pid for pid in _children(launcher.pid)}
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[0], signal.SIGTERM)
        code = launcher.wait(DEADLINE)
    finally:
        if launcher.poll() is None:
            for pid in _children(launcher.pid):
                os.kill(pid, signal.SIGKILL)
            launcher.send_signal(signal.SIGKILL)
            launcher.wait(30)
        reader.join(10)
        if launcher.stdout is not None:
            launcher.stdout.close()
    log = "".join(lines)
    assert answer.output_text == CAPITAL.expected
    assert code == 0, log
    # The default --distributed-backend any: the line names what mlx.launch started (ring).
    assert "sharded over 2 ranks (tensor parallel, ring)" in log
    assert "rank 1: rank 0 shut the model down" in log
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks.values())
