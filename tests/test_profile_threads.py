"""``bench/profile_threads.py`` over a hand-written py-spy raw profile: samples grouped by
thread, self samples from the leaf frame, inclusive samples counted once per stack even where a
rule matches several of its frames, and a same-named function in another file not counted."""

from __future__ import annotations

from .scripts_loader import bench_module

pt = bench_module("profile_threads")

GEN = (
    "thread (0x7F01): mlx-generation;Thread._bootstrap (threading.py:1002);"
    "GenerationThread._main (mlx_responses/engine/thread.py:200)"
)
TRIO = "thread (0x7F00): MainThread;run (trio/_core/_run.py:2300)"
RAW = "\n".join(
    [
        # The model's step, reached through Batch.step: 10 samples in GenerationBatch._step,
        # itself inside BatchGenerator.next (one rule, two frames: counted once).
        f"{GEN};Batch.step (mlx_responses/engine/batch.py:314);"
        "BatchGenerator.next (mlx_lm/generate.py:1891);"
        "GenerationBatch._step (mlx_lm/generate.py:1384) 10",
        f"{GEN};Batch.step (mlx_responses/engine/batch.py:314);"
        "Batch._deliver (mlx_responses/engine/batch.py:364);"
        "SequenceSlot.push (mlx_responses/engine/slot.py:84) 3",
        f"{GEN};GenerationThread._publish (mlx_responses/engine/thread.py:309);"
        "Batch.statistics (mlx_responses/engine/batch.py:471) 2",
        f"{GEN};GenerationThread._intake (mlx_responses/engine/thread.py:318) 1",
        f"{TRIO};ResponseRun._apply (mlx_responses/actors/run.py:328);"
        "ResponseMachine.feed (mlx_responses/protocol/events/machine.py:267);"
        "dumps (json/__init__.py:231);JSONEncoder.encode (json/encoder.py:200) 4",
        f"{TRIO};HTTPStream.app_send (hypercorn/protocol/http_stream.py:180) 5",
        # A ``feed`` of another class and a ``dumps`` outside json/: no rule counts them.
        f"{TRIO};SseParser.feed (mlx_responses/protocol/events/sse.py:59);"
        "dumps (orjsonlike/api.py:3) 6",
        "thread (0x7F02): asyncio_0;Thread.run (threading.py:982);work (x.py:5) 7",
        "thread (0x7F03);idle (y.py:1) 1",
        "",
        "not a sample line",
    ]
)


def test_groups_and_counts() -> None:
    summaries = {s.group: s for s in pt.summarize(RAW)}
    assert list(summaries) == ["mlx-generation", "MainThread", "other threads"]
    gen, trio_, other = (summaries[g] for g in ("mlx-generation", "MainThread", "other threads"))
    assert (gen.samples, trio_.samples, other.samples) == (16, 15, 8)
    assert other.threads == ("(unnamed)", "asyncio_0")

    gen_inclusive = dict(gen.inclusive)
    assert gen_inclusive["model step (BatchGenerator.next / GenerationBatch._step)"] == 10
    assert gen_inclusive["Batch.step"] == 13
    assert gen_inclusive["Batch._deliver"] == 3
    assert gen_inclusive["SequenceSlot.push"] == 3
    assert gen_inclusive["GenerationThread._publish"] == 2
    assert gen_inclusive["Batch.statistics"] == 2
    assert gen_inclusive["GenerationThread._intake"] == 1
    assert gen_inclusive["ResponseRun._apply"] == 0

    trio_inclusive = dict(trio_.inclusive)
    assert trio_inclusive["ResponseRun._apply"] == 4
    assert trio_inclusive["event machine (ResponseMachine.feed)"] == 4
    assert trio_inclusive["json encoding (json.dumps / JSONEncoder)"] == 4
    assert trio_inclusive["SSE writing (hypercorn HTTPStream.app_send)"] == 5

    assert gen.top_self[0] == ("GenerationBatch._step (mlx_lm/generate.py)", 10)
    assert trio_.top_self[0] == ("dumps (orjsonlike/api.py)", 6)
    assert dict(trio_.top_self)["JSONEncoder.encode (json/encoder.py)"] == 4


def test_format_names_every_group_and_rule() -> None:
    text = pt.format_summary(pt.summarize(RAW), "title")
    assert text.startswith("title\nsamples: 39 in all\n")
    for rule in pt.INTERESTING:
        assert text.count(f"  {rule.label}\n") == 3  # once per thread group
    assert "== mlx-generation: 16 samples" in text
