"""Time to first token, direct against server, per concurrency (``bench/throughput.py``).

Each run records, from its start, when the earliest stream's first token came and when the
latest stream's did (``Measurement.first_token_s``). Per concurrency this gives, for both:
the p50 over the repeats on each side, the server's overhead as the difference of those p50s,
and the median of the per-repeat differences (direct and server ran back to back, so their
difference is less exposed to drifting load than two medians taken apart).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SPREADS = ("earliest", "latest")  # index 0 and 1 of a Measurement's first_token_s


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def first_token_stats(
    direct: Sequence[tuple[float, float]], server: Sequence[tuple[float, float]]
) -> dict[str, dict[str, Any]]:
    """Per spread (earliest, latest stream): p50s in ms, the overhead (server - direct) as a
    difference of p50s and as the median of the paired differences, and the paired ones."""
    stats: dict[str, dict[str, Any]] = {}
    for index, spread in enumerate(SPREADS):
        d = [run[index] * 1e3 for run in direct]
        s = [run[index] * 1e3 for run in server]
        paired = [b - a for a, b in zip(d, s, strict=True)]
        stats[spread] = {
            "direct_p50_ms": _median(d),
            "server_p50_ms": _median(s),
            "overhead_ms": _median(s) - _median(d),
            "overhead_paired_ms": _median(paired),
            "paired_ms": [round(x, 2) for x in paired],
        }
    return stats


def _cells(data: Mapping[str, Any]) -> str:
    return (
        f"{data['direct_p50_ms']:>8.1f}  {data['server_p50_ms']:>8.1f}  "
        f"{data['overhead_ms']:>+8.1f}  {data['overhead_paired_ms']:>+10.1f}"
    )


def first_token_lines(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The printed table: one line per concurrency (rows as ``Row.as_json`` gives them)."""
    head = f"{'direct':>8}  {'server':>8}  {'overhead':>8}  {'per repeat':>10}"
    header = f"{'concurrency':>11}  {head}  |  {head}"
    lines = [
        "first token, ms from the start (p50 over repeats): the earliest stream | the latest",
        header,
        "-" * len(header),
    ]
    for row in rows:
        ft = row["first_token"]
        lines.append(
            f"{row['concurrency']:>11}  {_cells(ft['earliest'])}  |  {_cells(ft['latest'])}"
        )
    lines.append(
        "(overhead: server p50 - direct p50; per repeat: the median of the paired differences)"
    )
    return lines


def headline(row: Mapping[str, Any]) -> str:
    """One line for a concurrency that matters on its own (1 stream, the target's 16)."""
    ft = row["first_token"]["earliest"]
    paired = ", ".join(f"{r:.2f}" for r in row["paired_ratios"])
    streams = "1 stream" if row["concurrency"] == 1 else f"{row['concurrency']} streams"
    return (
        f"{streams}: server/direct {row['ratio']:.2f} (per repeat {paired}; "
        f"{row['direct_tok_s']:.1f} vs {row['server_tok_s']:.1f} tok/s); first token "
        f"direct {ft['direct_p50_ms']:.1f} ms, server {ft['server_p50_ms']:.1f} ms, "
        f"overhead {ft['overhead_paired_ms']:+.1f} ms"
    )
