"""Which marker opens which region, per family format (the tables the family parsers use)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from . import muse, pythonic
from .base import NewIndex, ToolSchemas
from .gemma import FUNCTION_GEMMA, GEMMA4, GemmaRegion
from .json_sections import DEEPSEEK_V3, KIMI_K2, SectionJsonRegion
from .region import RegionFactory, ToolRegion
from .xml_kv import GLM, KIMI_K3, LONGCAT, MINICPM5, MINIMAX_M2, MUSE_SPARK, KvRegion


def _pythonic(marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> ToolRegion:
    return pythonic.PythonicRegion(marker, new_index, schemas)


REGIONS: Mapping[str, Mapping[str, RegionFactory]] = {
    "glm47": {GLM.region_open: partial(KvRegion, GLM)},
    "longcat": {LONGCAT.region_open: partial(KvRegion, LONGCAT)},
    "minimax_m2": {MINIMAX_M2.region_open: partial(KvRegion, MINIMAX_M2)},
    "muse_spark": {
        MUSE_SPARK.region_open: partial(KvRegion, MUSE_SPARK),
        muse.ADDRESSED: muse.AddressedRegion,
    },
    "minicpm5": {MINICPM5.region_open: partial(KvRegion, MINICPM5)},
    "kimi_k2": {KIMI_K2.section_open: partial(SectionJsonRegion, KIMI_K2)},
    "deepseek_v3": {DEEPSEEK_V3.section_open: partial(SectionJsonRegion, DEEPSEEK_V3)},
    "gemma4": {GEMMA4.open: partial(GemmaRegion, GEMMA4)},
    "function_gemma": {FUNCTION_GEMMA.open: partial(GemmaRegion, FUNCTION_GEMMA)},
    "pythonic": {pythonic.OPEN: _pythonic},
    "kimi_k3": {KIMI_K3.region_open: partial(KvRegion, KIMI_K3)},
}
