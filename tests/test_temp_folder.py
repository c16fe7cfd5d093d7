"""A temp folder MLX cannot compile its kernels in stops ``serve`` at once, with the variable
named (``temp_folder.py``), instead of failing every request's first step later."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.temp_folder import FALLBACK, TEMP_VARIABLES, temp_folder_problem

from .console import SCRIPT

FOLDERS = {"/srv/tmp", "/var/tmp", FALLBACK}
VALUES = st.sampled_from(["/srv/tmp", "/var/tmp", "", "/no/such/folder", "/etc/hostname"])


@given(st.dictionaries(st.sampled_from(TEMP_VARIABLES), VALUES), st.booleans())
def test_the_first_variable_set_decides_as_cplusplus_reads_them(
    environ: dict[str, str], fallback_exists: bool
) -> None:
    folders = FOLDERS if fallback_exists else FOLDERS - {FALLBACK}
    problem = temp_folder_problem(environ, folders.__contains__)
    first = next((name for name in TEMP_VARIABLES if name in environ), None)
    if first is None:
        assert (problem is None) == fallback_exists
        return
    if environ[first] in folders:
        assert problem is None
    else:
        assert problem is not None
        assert problem.startswith(f"{first}={environ[first]!r} is not a folder")


@pytest.mark.parametrize("value", ["", "missing"])
def test_serve_refuses_to_start_naming_the_variable_and_leaves_nothing(
    tmp_path: Path, value: str
) -> None:
    temp = str(tmp_path / value) if value else ""
    data = tmp_path / "data"
    env = {
        **{k: v for k, v in os.environ.items() if k not in TEMP_VARIABLES},
        "TMPDIR": temp,
        "MLX_RESPONSES_PORT": "0",
        "MLX_RESPONSES_DATA_DIR": str(data),
    }
    done = subprocess.run(
        [str(SCRIPT), "serve"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert f"mlx-responses: TMPDIR={temp!r} is not a folder" in done.stderr
    assert "serving" not in done.stderr
    assert not data.exists()  # no store was opened
