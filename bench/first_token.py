"""Time to first token, direct against server, per concurrency (``bench/throughput.py``).

Each run records, from its start, when the earliest stream's first token came and when the
latest stream's did (``Measurement.first_token_s``). Per concurrency this gives, for both:
the p50 over the repeats on each side, the server's overhead as the difference of those p50s,
and the median of the per-repeat differences (direct and server ran back to back, so their
difference is less exposed to drifting load than two medians taken apart).

Each run also records every request's own time to its first token, every turn of every
stream (``Measurement.request_first_s``): from its insertion into the batch (direct) or its
send by the client (server). ``per_request`` pools them over the repeats: one stream of four
turns over five repeats gives 20 requests a side where the first turn alone gives 5.
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
    direct: Sequence[tuple[float, float]],
    server: Sequence[tuple[float, float]],
    direct_requests: Sequence[Sequence[float]] = (),
    server_requests: Sequence[Sequence[float]] = (),
) -> dict[str, dict[str, Any]]:
    """Per spread (earliest, latest stream): p50s in ms, the overhead (server - direct) as a
    difference of p50s and as the median of the paired differences, and the paired ones; and
    ``per_request``: every request's own, pooled over the repeats (``request_stats``)."""
    stats: dict[str, dict[str, Any]] = {
        "per_request": request_stats(direct_requests, server_requests)
    }
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


def request_stats(
    direct: Sequence[Sequence[float]], server: Sequence[Sequence[float]]
) -> dict[str, Any]:
    """Every request's time to its first token, pooled over the repeats (seconds in, ms out):
    the p50 of each side, the overhead as their difference, the per-repeat differences of the
    p50s (paired: one repeat's sides ran back to back) and their median, and the counts."""
    d = [x * 1e3 for run in direct for x in run]
    s = [x * 1e3 for run in server for x in run]
    paired = [
        _median([y * 1e3 for y in b]) - _median([x * 1e3 for x in a])
        for a, b in zip(direct, server, strict=True)
        if a and b
    ]
    return {
        "direct_p50_ms": _median(d),
        "server_p50_ms": _median(s),
        "overhead_ms": _median(s) - _median(d),
        "overhead_paired_ms": _median(paired),
        "paired_ms": [round(x, 2) for x in paired],
        "requests": [len(d), len(s)],
    }


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
    lines.append("")
    lines.append("first token, ms from each request's send (p50 over every turn of the repeats)")
    lines.append(f"{'concurrency':>11}  {head}  {'requests':>9}")
    for row in rows:
        pr = row["first_token"].get("per_request")
        if pr and pr["requests"][1]:
            lines.append(f"{row['concurrency']:>11}  {_cells(pr)}  {pr['requests'][1]:>9}")
    return lines


def headline(row: Mapping[str, Any]) -> str:
    """One line for a concurrency that matters on its own (1 stream, the target's 16)."""
    ft = row["first_token"]["earliest"]
    paired = ", ".join(f"{r:.2f}" for r in row["paired_ratios"])
    streams = "1 stream" if row["concurrency"] == 1 else f"{row['concurrency']} streams"
    line = (
        f"{streams}: server/direct {row['ratio']:.2f} (per repeat {paired}; "
        f"{row['direct_tok_s']:.1f} vs {row['server_tok_s']:.1f} tok/s); first token "
        f"direct {ft['direct_p50_ms']:.1f} ms, server {ft['server_p50_ms']:.1f} ms, "
        f"overhead {ft['overhead_paired_ms']:+.1f} ms"
    )
    pr = row["first_token"].get("per_request")
    if pr and pr["requests"][1]:
        line += (
            f"; per request ({pr['requests'][1]}, every turn): direct "
            f"{pr['direct_p50_ms']:.1f} ms, server {pr['server_p50_ms']:.1f} ms, overhead "
            f"{pr['overhead_ms']:+.1f} ms (per repeat {pr['overhead_paired_ms']:+.1f})"
        )
    return line
