"""Which backend a sharded server shows (issue 26): ``--distributed-backend any`` is named by
what ``mlx.launch`` set up for the rank; an explicit choice is shown as given."""

from __future__ import annotations

from mlx_responses.engine.distributed import backend_in_use


def test_any_is_named_by_what_mlx_launch_set_up() -> None:
    assert backend_in_use("any", {"MLX_HOSTFILE": "/tmp/hosts.json", "MLX_RANK": "0"}) == "ring"
    assert backend_in_use("any", {"MLX_IBV_DEVICES": "[]", "MLX_RANK": "1"}) == "jaccl"
    assert backend_in_use("any", {"MLX_JACCL_COORDINATOR": "10.0.0.1:5000"}) == "jaccl"
    assert backend_in_use("any", {"OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"
    assert backend_in_use("any", {}) == "any"


def test_an_explicit_backend_is_shown_as_given() -> None:
    assert backend_in_use("ring", {"MLX_IBV_DEVICES": "[]"}) == "ring"
