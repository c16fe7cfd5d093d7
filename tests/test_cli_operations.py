"""Issue 16: the command line a person operates: --version, serve --check, model loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH

DEADLINE = 120
CLI = str(Path(sys.executable).with_name("mlx-responses"))


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={**os.environ, **(env or {})},
        check=False,
    )


def assert_flag_refused(flag: str, variable: str, value: str, expected: str) -> None:
    """``serve`` refuses ``value`` for ``flag`` (exit 2), naming the flag and what it expects,
    and refuses it from the environment ``variable`` too, naming both."""
    done = cli("serve", f"{flag}={value}")
    assert done.returncode == 2
    assert flag in done.stderr
    assert f"expected {expected}, got {value!r}" in done.stderr
    by_env = cli("serve", env={variable: value})
    assert by_env.returncode == 2
    assert f"{variable}={value!r} is not a valid {flag}" in by_env.stderr


def test_version_names_the_package_and_mlx() -> None:
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mlx-responses 0.1.0")
    assert "mlx-lm 0.32.2" in done.stdout


def test_check_passes_on_the_bundled_model(tmp_path: Path) -> None:
    # --port and the store flags are overridden by --check: nothing is bound or written there.
    done = cli("serve", "--check", "--port", "1", "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "The capital of France is Paris." in done.stdout
    assert "check passed (the documented answer)" in done.stdout
    assert "first token" in done.stdout
    assert "output tokens" in done.stdout
    # The start-up line: model, size, context window, tool format, reasoning, backend.
    assert "model mlx-responses-tiny" in done.stderr
    assert "1.9 MB of weights" in done.stderr
    assert "context window 2048 tokens, tool format hermes, reasoning yes" in done.stderr
    assert "MLX " in done.stderr
    assert "cpu" in done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is a Linux matter")
def test_blas_is_named_and_the_hint_given_once_without_openblas() -> None:
    done = cli("serve", "--check", env={"MLX_RESPONSES_OPENBLAS": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "with the reference BLAS" in done.stderr
    assert done.stderr.count("apt-get install libopenblas0-pthread") == 1


def test_an_offline_hub_id_fails_fast_naming_the_model(tmp_path: Path) -> None:
    model = "mlx-responses-tests/no-such-model"
    done = cli(
        "serve",
        "--model",
        model,
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith(f"mlx-responses: Cannot load the model '{model}'")
    assert "HF_HUB_OFFLINE is set" in message
    assert "\n" not in message  # one paragraph


def _copy_model(into: Path, leave_out: str) -> Path:
    into.mkdir()
    for item in BUNDLED_MODEL_PATH.iterdir():
        if item.is_file() and item.name != leave_out:
            (into / item.name).write_bytes(item.read_bytes())
    return into


@pytest.mark.parametrize(
    ("leave_out", "named"),
    [
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tokenizer.json"),
        ("config.json", "no config.json"),
    ],
)
def test_a_folder_that_is_not_a_model_names_the_missing_file(
    tmp_path: Path, leave_out: str, named: str
) -> None:
    folder = _copy_model(tmp_path / "model", leave_out)
    done = cli("serve", "--model", str(folder))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert f"Cannot load the model '{folder}'" in done.stderr
    assert named in done.stderr


def test_a_config_without_a_model_type_is_named(tmp_path: Path) -> None:
    folder = _copy_model(tmp_path / "model", "")
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    done = cli("serve", "--model", str(folder))
    assert done.returncode != 0
    assert '"model_type"' in done.stderr
    assert "Traceback" not in done.stderr
