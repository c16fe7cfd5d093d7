"""The ``slow`` marker is read from the source (tests/slow_marks.py): what starts a real part is
slow, wherever the import that starts it sits; what only names a type is not."""

from __future__ import annotations

from pathlib import Path

from .slow_marks import TESTS, is_slow, starts_real_parts


def module(name: str) -> Path:
    return TESTS / f"{name}.py"


def test_a_module_that_starts_the_server_or_the_model_is_slow() -> None:
    assert starts_real_parts(module("test_api_streaming"))  # mlx_responses.server.serve
    assert starts_real_parts(module("test_bundled_model"))  # mlx_lm
    assert starts_real_parts(module("test_gather"))  # the generation thread
    assert starts_real_parts(module("test_cli_operations"))  # a subprocess


def test_an_import_inside_a_fixture_counts() -> None:
    # Its only import of ``serve`` is inside a fixture's body.
    assert (
        "\nfrom mlx_responses.server import serve"
        not in module("test_api_client_surface").read_text()
    )
    assert starts_real_parts(module("test_api_client_surface"))


def test_a_test_helper_module_that_starts_a_part_makes_its_importer_slow() -> None:
    assert starts_real_parts(module("test_storage_postgres"))  # tests/postgres.py
    assert starts_real_parts(module("test_fuzz_smoke"))  # tests/fuzz/http_fuzz.py
    assert starts_real_parts(module("test_blas_threads"))  # another slow test module's helpers


def test_pure_modules_and_type_imports_are_fast() -> None:
    for name in ("test_sealed", "test_slot", "test_sse_writer", "test_protocol_machine"):
        assert not starts_real_parts(module(name)), name
    assert not starts_real_parts(module("test_hostile_text"))  # names ServerHandle only


def test_a_real_part_fixture_makes_a_test_slow_in_any_module() -> None:
    assert is_slow(module("test_hostile_text"), ["server", "nursery"])
    assert is_slow(module("test_sealed"), ["postgresql_url"])
    assert not is_slow(module("test_hostile_text"), ["nursery", "tmp_path"])
