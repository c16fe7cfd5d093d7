"""The composite parser for the family formats: ``StreamParser``'s text/reasoning/region
machinery with the family's own region markers.

Invariants: those of ``StreamParser`` (chunking never matters, calls indexed 0.. in order,
argument deltas join to the final arguments). Each marker in ``regions`` opens the region its
factory builds; without ``tools_enabled`` no marker opens one and all of them are text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .base import NewIndex
from .region import ToolRegion, ToolSchemas
from .stream import THINK_CLOSE, THINK_OPEN, StreamParser

RegionFactory = Callable[[str, NewIndex, ToolSchemas | None], ToolRegion]
"""``(shown_if_reverted, new_index, schemas) -> region``: the region a marker opens."""


class FamilyParser(StreamParser):
    """One generation's parser for a family format (module docstring)."""

    def __init__(
        self,
        *,
        regions: Mapping[str, RegionFactory],
        tools_enabled: bool,
        reasoning: bool,
        starts_in_reasoning: bool = False,
        tool_schemas: ToolSchemas | None = None,
        think: tuple[str, str] = (THINK_OPEN, THINK_CLOSE),
        hidden: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            tool_format="none",
            tools_enabled=False,
            reasoning=reasoning,
            starts_in_reasoning=starts_in_reasoning,
            tool_schemas=tool_schemas,
            think=think,
            hidden=hidden,
        )
        self._regions = dict(regions) if tools_enabled else {}
        self._tool_markers = tuple(self._regions)
        self._markers = (think if reasoning else ()) + hidden + self._tool_markers

    def _open_region(self, marker: str, shown_if_reverted: str) -> ToolRegion:
        return self._regions[marker](shown_if_reverted, self._new_index, self._schemas)
