"""Per-thread summaries of a py-spy raw profile (``py-spy record --threads -f raw``).

Pure functions over the collapsed-stack text, one line per distinct stack::

    thread (0x7F3A..): mlx-generation;Thread._bootstrap (threading.py:1002);...;leaf (f.py:9) 12

(the first frame names the thread when ``--threads`` is given; the trailing number is how many
samples had that stack). Samples are grouped by thread: the server's generation thread
("mlx-generation"), its Trio thread ("MainThread"), the rest together. For each group: its sample
count, the functions with the most *self* samples (the leaf frame), and the *inclusive* samples
of a fixed list of frames that matter to the server's speed (a sample counts once per rule,
however many of its frames match).

Run on a file: ``python bench/profile_threads.py FILE [FILE...]``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

GENERATION_THREAD = "mlx-generation"
TRIO_THREAD = "MainThread"
OTHER_THREADS = "other threads"
GROUP_ORDER = (GENERATION_THREAD, TRIO_THREAD, OTHER_THREADS)
TOP_FUNCTIONS = 20

_THREAD = re.compile(r"^thread \((?:0x)?[0-9A-Fa-f]+\)(?::\s*(?P<name>[^;]*))?$")
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True, slots=True)
class Frame:
    name: str  # "Class.method" or "function" (py-spy's qualified name)
    file: str  # as py-spy prints it (shortened), "" when absent

    @property
    def label(self) -> str:
        return f"{self.name} ({self.file})" if self.file else self.name


@dataclass(frozen=True, slots=True)
class Stack:
    thread: str  # the thread's name, "" when py-spy gave none
    frames: tuple[Frame, ...]  # outermost first
    samples: int

    @property
    def group(self) -> str:
        return self.thread if self.thread in (GENERATION_THREAD, TRIO_THREAD) else OTHER_THREADS


@dataclass(frozen=True, slots=True)
class FrameRule:
    """A frame worth counting: any frame whose name is one of ``names`` and whose file contains
    ``file`` (a path fragment, so that a same-named function elsewhere does not count)."""

    label: str
    names: tuple[str, ...]
    file: str = ""

    def matches(self, frame: Frame) -> bool:
        return frame.name in self.names and self.file in frame.file


INTERESTING: tuple[FrameRule, ...] = (
    FrameRule(
        "model step (BatchGenerator.next / GenerationBatch._step)",
        ("BatchGenerator.next", "GenerationBatch._step"),
        "mlx_lm/generate.py",
    ),
    FrameRule(
        "a lone sequence's step (Batch._solo_step, the model on its own cache)",
        ("Batch._solo_step",),
        "engine/batch.py",
    ),
    FrameRule("Batch.step", ("Batch.step",), "engine/batch.py"),
    FrameRule("Batch._deliver", ("Batch._deliver",), "engine/batch.py"),
    FrameRule("GenerationThread._intake", ("GenerationThread._intake",), "engine/thread.py"),
    FrameRule("GenerationThread._publish", ("GenerationThread._publish",), "engine/thread.py"),
    FrameRule("Batch.statistics", ("Batch.statistics",), "engine/batch.py"),
    FrameRule("SequenceSlot.push", ("SequenceSlot.push",), "engine/slot.py"),
    FrameRule("ResponseRun._apply", ("ResponseRun._apply",), "actors/run.py"),
    FrameRule("event machine (ResponseMachine.feed)", ("ResponseMachine.feed",), "events/machine"),
    FrameRule("SSE writing (hypercorn HTTPStream.app_send)", ("HTTPStream.app_send",), "hypercorn"),
    FrameRule(
        "json encoding (json.dumps / JSONEncoder)",
        ("dumps", "JSONEncoder.encode", "JSONEncoder.iterencode"),
        "json/",
    ),
)


def parse_frame(text: str) -> Frame:
    match = _FRAME.match(text)
    if match is None:
        return Frame(text, "")
    return Frame(match["name"], match["file"])


def parse_line(line: str) -> Stack | None:
    """One raw line as a stack; None for a blank or malformed line (no sample count)."""
    body, _, count = line.strip().rpartition(" ")
    if not body or not count.isdigit():
        return None
    parts = body.split(";")
    if parts and parts[0].startswith("process "):  # --subprocesses puts the process first
        parts = parts[1:]
    thread = ""
    if parts and (match := _THREAD.match(parts[0])):
        thread = (match["name"] or "").strip()
        parts = parts[1:]
    return Stack(thread, tuple(parse_frame(p) for p in parts if p), int(count))


def parse_raw(text: str) -> list[Stack]:
    return [s for s in (parse_line(line) for line in text.splitlines()) if s is not None]


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    group: str
    samples: int
    threads: tuple[str, ...]  # the thread names seen in this group
    top_self: tuple[tuple[str, int], ...]  # (function label, self samples), most first
    inclusive: tuple[tuple[str, int], ...]  # (rule label, inclusive samples), INTERESTING order


def summarize_group(
    group: str, stacks: Sequence[Stack], rules: Sequence[FrameRule] = INTERESTING
) -> ThreadSummary:
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack in stacks:
        if stack.frames:
            leaves[stack.frames[-1].label] += stack.samples
        for rule in rules:
            if any(rule.matches(frame) for frame in stack.frames):
                inclusive[rule.label] += stack.samples
    return ThreadSummary(
        group=group,
        samples=sum(s.samples for s in stacks),
        threads=tuple(sorted({s.thread or "(unnamed)" for s in stacks})),
        top_self=tuple(leaves.most_common(TOP_FUNCTIONS)),
        inclusive=tuple((rule.label, inclusive[rule.label]) for rule in rules),
    )


def summarize(text: str, rules: Sequence[FrameRule] = INTERESTING) -> list[ThreadSummary]:
    """Summaries per thread group, in GROUP_ORDER, groups without samples left out."""
    stacks = parse_raw(text)
    return [
        summarize_group(group, members, rules)
        for group in GROUP_ORDER
        if (members := [s for s in stacks if s.group == group])
    ]


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def format_summary(summaries: Iterable[ThreadSummary], title: str = "") -> str:
    summaries = list(summaries)
    total = sum(s.samples for s in summaries)
    lines = [title] if title else []
    lines.append(f"samples: {total} in all")
    for summary in summaries:
        lines.append("")
        lines.append(
            f"== {summary.group}: {summary.samples} samples ({_share(summary.samples, total)} "
            f"of all; threads: {', '.join(summary.threads)})"
        )
        lines.append("  inclusive samples (share of this thread's):")
        for label, count in summary.inclusive:
            lines.append(f"    {count:>7}  {_share(count, summary.samples)}  {label}")
        lines.append(f"  top {TOP_FUNCTIONS} functions by self samples:")
        for label, count in summary.top_self:
            lines.append(f"    {count:>7}  {_share(count, summary.samples)}  {label}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-thread summary of py-spy raw profiles.")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.files:
        print(format_summary(summarize(path.read_text(errors="replace")), str(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
