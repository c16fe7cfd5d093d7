"""The sealed-reasoning core (protocol/sealed.py): round trip, binding, tamper detection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.protocol.items.sealed import Sealer, SealError


def sealer(key: bytes = b"k", model: str = "m") -> Sealer:
    return Sealer(lambda: key, model)


@given(st.text())
def test_round_trip(text: str) -> None:
    assert sealer().unseal(sealer().seal(text)) == text


@given(st.text(min_size=1), st.integers(min_value=0))
def test_any_changed_character_is_refused(text: str, where: int) -> None:
    blob = sealer().seal(text)
    i = len("mlxr1.") + where % (len(blob) - len("mlxr1."))
    changed = blob[:i] + ("A" if blob[i] != "A" else "B") + blob[i + 1 :]
    with pytest.raises(SealError):
        assert sealer().unseal(changed) != text


def test_bound_to_key_and_model() -> None:
    blob = sealer().seal("secret reasoning")
    with pytest.raises(SealError):
        sealer(key=b"other").unseal(blob)
    with pytest.raises(SealError):
        sealer(model="other-model").unseal(blob)


def test_opaque_and_does_not_repeat() -> None:
    one, two = sealer().seal("same text"), sealer().seal("same text")
    assert one != two
    assert "same" not in one


def test_key_read_once_and_only_when_used() -> None:
    calls: list[int] = []

    def key() -> bytes:
        calls.append(1)
        return b"k"

    lazy = Sealer(key, "m")
    assert calls == []
    lazy.unseal(lazy.seal("a"))
    lazy.seal("b")
    assert calls == [1]
