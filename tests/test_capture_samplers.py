"""What a capture samples beside its step times (`runner.samplers`): when the allocator is read at a step
boundary, and the reasons given where there is nothing to sample."""

from __future__ import annotations

from gpudoctor.runner.phases import LiveOptions
from gpudoctor.runner.samplers import (
    MEMORY_EACH_STEPS,
    MEMORY_EVERY_S,
    MemoryCadence,
    NvmlSampling,
    allocator_statistics,
)


def test_the_light_phase_reads_its_first_steps_then_one_group_of_steps_at_a_time() -> None:
    cadence = MemoryCadence()
    now, step_s = 10.0, MEMORY_EVERY_S / 4 * 1.01  # steps a little over a quarter of the group
    read = []
    for _ in range(MEMORY_EACH_STEPS + 8):
        due = cadence.due("light", now)
        if due:
            cadence.read(now)
        read.append(due)
        now += step_s
    # each of the first steps alone, then every fourth: a group at least MEMORY_EVERY_S long
    assert read[:MEMORY_EACH_STEPS] == [True] * MEMORY_EACH_STEPS
    assert read[MEMORY_EACH_STEPS:] == [False, False, False, True] * 2
    assert cadence.light_rows == MEMORY_EACH_STEPS + 2


def test_other_phases_read_every_step_and_a_new_light_phase_starts_over() -> None:
    cadence = MemoryCadence()
    for _ in range(MEMORY_EACH_STEPS):
        assert cadence.due("light", 0.0)
    assert not cadence.due("light", 0.0)
    assert cadence.due("warmup", 0.0) and cadence.due("traced", 0.0)
    cadence.restart()  # the step changed: the warm-up and the light phase begin again
    assert cadence.due("light", 0.0)


def test_nothing_to_sample_is_a_reason_not_an_error() -> None:
    assert allocator_statistics(cuda=False) == (
        None,
        "no CUDA device in use: torch.cuda memory statistics are GPU-only",
    )
    off = NvmlSampling(LiveOptions(nvml=False))
    off.start(cuda=True)
    off.stop()  # never started: nothing to stop
    assert (off.samples, off.summary, off.missing) == ((), None, "turned off (--no-nvml)")
    cpu = NvmlSampling(LiveOptions())
    cpu.start(cuda=False)
    assert cpu.missing == "no CUDA device in use"
