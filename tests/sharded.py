"""Helpers for the sharded-model tests and benchmark (issue 26): a model split over 2 ranks of
MLX's ring backend on loopback, each rank the real ``mlx-responses serve`` in its own process,
started as ``mlx.launch`` starts them (``MLX_RANK`` and a host file), so that a test can kill
one rank and watch the others.

``qwen2_copy`` writes the pipeline fixture: the bundled model's weights in mlx-lm's ``qwen2``
class, which can be split by layers (``qwen3``, the bundled model's class, cannot). Qwen2 has
no query/key norms and has attention biases: the norms are dropped and the biases are zero, so
it is a different model with deterministic weights, compared against itself in one process.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH

SCRIPT = Path(sys.executable).with_name("mlx-responses")
START_SECONDS = 120
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports, drawn below the kernel's ephemeral range
    (32768 and up here): a port the kernel handed out for a probe can be handed out again to
    any outgoing connection (the other tests' HTTP clients) before a rank binds it, and then
    the rank fails with "Couldn't bind socket"."""
    rng = random.SystemRandom()
    while True:
        first = rng.randrange(20000, 32000 - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first


def qwen2_copy(out: Path, source: Path = BUNDLED_MODEL_PATH) -> Path:
    """A qwen3 model's weights (the bundled model's unless ``source``) as a ``qwen2`` model in
    ``out`` (made once; see the module header)."""
    from safetensors.numpy import load_file, save_file

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    config = json.loads((source / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    config.pop("head_dim", None)  # qwen2 derives it: hidden_size / num_attention_heads
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = dict(load_file(source / "model.safetensors"))
    for name in [k for k in weights if k.endswith(("q_norm.weight", "k_norm.weight"))]:
        del weights[name]
    for name in [
        k for k in weights if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))
    ]:
        bias = name.removesuffix("weight") + "bias"
        weights[bias] = weights[name][:, 0] * 0
    save_file(weights, str(out / "model.safetensors"))
    return out


@dataclass
class Ranks:
    """Two ranks of one sharded server: rank 0 serves HTTP at ``base_url``."""

    processes: list[subprocess.Popen[bytes]]
    logs: list[list[str]]
    base_url: str = ""
    threads: list[threading.Thread] = field(default_factory=list)

    def log(self, rank: int) -> str:
        return "".join(self.logs[rank])

    def stop(self, timeout: float = 60) -> list[int]:
        """SIGTERM rank 0 (the followers hear its shutdown); every rank's exit status."""
        if self.processes[0].poll() is None:
            self.processes[0].send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> list[int]:
        codes = []
        try:
            for process in self.processes:
                codes.append(process.wait(timeout))
        finally:
            self.close()
        return codes

    def close(self) -> None:
        """Kill what still runs; read the logs to their end; close the pipes."""
        self.kill()
        for thread in self.threads:
            thread.join(5)
        for process in self.processes:
            if process.stderr is not None:
                process.stderr.close()

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def _pump(stream: object, lines: list[str], ready: threading.Event, found: list[str]) -> None:
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        line = raw.decode(errors="replace")
        lines.append(line)
        served = re.search(r"serving \S+ at (http://[\d.:]+)", line)
        if served and not found:
            found.append(served.group(1))
            ready.set()
    ready.set()  # the process ended


def start_ranks(model: Path, folder: Path, *args: str, size: int = 2) -> Ranks:
    """``mlx-responses serve --model MODEL ARGS`` on ``size`` ring ranks on loopback."""
    hosts = folder / "hosts.json"
    first = free_port(size)
    hosts.write_text(json.dumps([[f"127.0.0.1:{first + rank}"] for rank in range(size)]))
    processes = []
    logs: list[list[str]] = [[] for _ in range(size)]
    ready = threading.Event()
    found: list[str] = []
    ranks = Ranks(processes, logs)
    for rank in range(size):
        env = {
            **os.environ,
            "MLX_RANK": str(rank),
            "MLX_HOSTFILE": str(hosts),
            "MLX_RESPONSES_DATA_DIR": str(folder / f"data{rank}"),
        }
        command = [str(SCRIPT), "serve", "--model", str(model), "--port", "0"]
        command += ["--distributed-backend", "ring", "--store", "memory", *args]
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        processes.append(process)
        thread = threading.Thread(
            target=_pump,
            args=(process.stderr, logs[rank], ready if rank == 0 else threading.Event(), found),
            daemon=True,
        )
        thread.start()
        ranks.threads.append(thread)
    if not ready.wait(START_SECONDS) or not found:
        ranks.close()
        raise AssertionError(f"the sharded server did not start:\n{ranks.log(0)}\n{ranks.log(1)}")
    ranks.base_url = found[0]
    return ranks


def start_single(model: Path, folder: Path, *args: str) -> Ranks:
    """The same server in one process, for the reference answers."""
    ready = threading.Event()
    found: list[str] = []
    command = [str(SCRIPT), "serve", "--model", str(model), "--port", "0", "--store", "memory"]
    env = {**os.environ, "MLX_RESPONSES_DATA_DIR": str(folder / "single")}
    env.pop("MLX_RANK", None)
    process = subprocess.Popen([*command, *args], env=env, stderr=subprocess.PIPE)
    ranks = Ranks([process], [[]])
    thread = threading.Thread(
        target=_pump, args=(process.stderr, ranks.logs[0], ready, found), daemon=True
    )
    thread.start()
    ranks.threads.append(thread)
    if not ready.wait(START_SECONDS) or not found:
        ranks.close()
        raise AssertionError(f"the server did not start:\n{ranks.log(0)}")
    ranks.base_url = found[0]
    return ranks
