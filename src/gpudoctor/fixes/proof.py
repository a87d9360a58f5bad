"""The proof by the diff, as data and decisions: `Proof` (the patched copy of the user's files against the
untouched script, each run as a plain process, in pairs), when enough pairs were timed, what the pairs
say, and how the harness's figures stand beside the proof's — the level of its baseline against plain
processes of the script (`HarnessLevel`), its saving against the proof's (`disagreement`), and the
report's headline (`Headline`). Pure: `fixes.prove` runs the processes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpudoctor.runner.record import StepFound
from gpudoctor.timing.paired import Pair, PairedComparison, paired_compare, t_quantile

MIN_PAIRS = 3  # process pairs before the proof may stop (df 2)
MAX_PAIRS = 10  # without a time budget, at most
TARGET_HALF_WIDTH = 0.05  # the 95% interval of the speedup, ±5% of it: tight enough to state
LEVEL_WARN = 0.10  # the harness's baseline this far from plain processes of the script: a warning
LEVEL_PROCESSES = 3  # plain processes of the script alone, for the level, where no proof timed it
COUNTABLE = ("optimizer", "module", "dataloader")  # step sources the stopwatch counts plainly
UNIT = "process pair"
CLOCK_GAP = 0.03  # the two sides' mean SM clocks this far apart while timed: said beside the proof
SLOWDOWN_SHARE = 0.10  # a clock-lowering reason active in this share of a side's samples: said
OTHERS_CORES = 0.5  # other processes kept this many cores busy (mean) while a side was timed: said
STEAL_CORES = 0.1  # the hypervisor took this many cores: said
PROBE_SPREAD = 1.2  # the host's probe this much slower in one process than in another: said


@dataclass(frozen=True)
class ProcessClocks:
    """The GPU's clocks (NVML) and the host (/proc, `monitor.host`) while a plain process's steps were
    timed, read from the proof's own process (nothing in the timed one); `samples` 0: no NVML."""

    samples: int
    sm_mean_mhz: float | None
    sm_min_mhz: int | None
    sm_max_mhz: int | None  # the GPU's maximum
    slowdowns: tuple[tuple[str, float], ...] = ()  # a reason that lowers clocks, the share of samples
    temp_max_c: int | None = None
    power_mean_w: float | None = None
    # the host over the same windows (`monitor.host`), read from /proc: cores other processes kept busy,
    # cores the hypervisor took, a fixed Python loop's time (µs); None where /proc was not read
    host_samples: int = 0
    others_cores: float | None = None
    steal_cores: float | None = None
    probe_us: float | None = None


@dataclass(frozen=True)
class PlainProcess:
    """One plain process of the proof: the script as written or the patched copy."""

    side: str  # script, patched
    mean_step_us: float | None  # over its timed windows; None where it failed
    steps_timed: int
    set_aside: int  # windows set aside (torch.compile compiled in them)
    warmup_steps: int
    wall_s: float
    exit_code: int | None  # None: ended at its time limit
    failure: str | None
    log: str
    clocks: ProcessClocks | None = None  # None: neither NVML nor /proc (or ranks on several GPUs)


@dataclass(frozen=True)
class ProofPair:
    script_us: float
    patched_us: float
    patched_first: bool


@dataclass(frozen=True)
class Proof:
    # faster, same, slower, ambiguous (timed); does not apply, does not run (the diff's fault); not made
    verdict: str
    recommended: bool | None  # None: not made (the harness's figure stands, unproven)
    reason: str
    speedup: float | None  # script / patched: the geometric mean over the pairs
    speedup_low: float | None  # its 95% interval
    speedup_high: float | None
    p_value: float | None
    script_us: float | None  # mean over the script's processes of their mean step
    patched_us: float | None
    pairs: tuple[ProofPair, ...]
    processes: tuple[PlainProcess, ...]
    test: str | None
    half_width_pct: float | None  # of the speedup's interval, in % of it
    target_half_width_pct: float
    step: str | None  # what a step is, as the harness's baseline found it
    script_command: tuple[str, ...]
    patched_command: tuple[str, ...]
    cwd: str
    env: dict[str, str]  # what the proof adds to the user's environment
    copy: str | None  # the patched copy's folder
    cores: tuple[int, ...]  # the cores the processes ran on (the rounds' too)
    elapsed_s: float
    clocks: str | None = None  # what the GPU's clocks did while the sides were timed, where worth saying

    @property
    def saving_pct(self) -> float | None:
        return None if self.speedup is None else 100 * (1 - 1 / self.speedup)


@dataclass(frozen=True)
class ProofRequest:
    """What the session hands the prover: the recommended change and how the harness counted a step."""

    fixes: tuple[str, ...]
    diff: str
    snippets: tuple[str, ...]
    step: StepFound | None
    seconds_left: float | None  # of the time budget; None: no budget
    step_us: float | None = None  # the harness's baseline mean step (ranks time a number of steps from it)


class Prover(Protocol):
    def reserve_s(self, round_s: float) -> float:
        """The time to keep back for the proof, from a baseline round's length."""
        ...

    def __call__(self, request: ProofRequest) -> Proof: ...

    def script_alone(self, request: ProofRequest, count: int) -> tuple[PlainProcess, ...]:
        """The script as written, `count` plain processes, for the harness's level where no proof timed
        it (nothing kept, or a diff that does not apply); none where a plain process cannot count
        the step."""
        ...


@dataclass(frozen=True)
class HarnessLevel:
    """The harness's baseline mean step beside plain processes of the script (the proof's A side)."""

    harness_us: float
    plain_us: float
    ratio: float  # harness / plain
    warning: str | None
    ratio_low: float | None = None  # its 95% interval, where each side had two processes at least
    ratio_high: float | None = None


@dataclass(frozen=True)
class Headline:
    """The report's figure: the proof's where it was made, else the harness's (unproven)."""

    source: str  # proof, harness
    recommended: bool
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    harness_speedup: float | None  # beside it


# -- decisions ------------------------------------------------------------------------------------------
def compare(pairs: Sequence[ProofPair]) -> PairedComparison:
    """The paired test on the pairs: B (the patched copy) against A (the script)."""
    return paired_compare(
        [Pair(p.script_us, p.patched_us, b_first=p.patched_first) for p in pairs], unit=UNIT
    )


def half_width(c: PairedComparison) -> float:
    """Half the 95% interval of the ratio on the log scale: ±this share of the figure."""
    return math.log(c.ci_high / c.ci_low) / 2 if c.ci_low > 0 else math.inf


def enough(pairs: Sequence[ProofPair], target: float = TARGET_HALF_WIDTH, min_pairs: int = MIN_PAIRS) -> bool:
    """Tight enough to state: `min_pairs` at least, and the interval within ±`target`."""
    return len(pairs) >= min_pairs and half_width(compare(pairs)) <= target


def timed_reason(c: PairedComparison) -> tuple[bool, str]:
    """Recommended or not, and why, from the pairs' verdict."""
    speed = f"{1 / c.ratio:.2f}× (95% CI {1 / c.ci_high:.2f}–{1 / c.ci_low:.2f}×, {c.pairs} {UNIT}s)"
    if c.verdict == "faster":
        return True, f"the patched copy ran faster as you run it: {speed}"
    if c.verdict == "slower":
        return False, f"the patched copy ran slower as you run it: {speed}"
    if c.verdict == "same":
        return False, f"the patched copy ran no faster as you run it: {speed}"
    return False, f"the patched copy was not faster beyond noise as you run it: {speed}"


def harness_level(
    harness_us: float | None,
    plain: Sequence[float],
    warn: float = LEVEL_WARN,
    harness_processes: Sequence[float] = (),
    proven: bool = True,
) -> HarnessLevel | None:
    """The harness's baseline against plain processes of the script (their mean steps: the proof's A
    side, or the script alone where nothing was proven), where both were timed; with the harness's
    processes' own means, how sure the difference is (a loader-paced loop's processes can differ by a
    third: a level 20% off from four of them may be noise). `proven`: a proof's figure stands beside."""
    plain = [v for v in plain if v and v > 0]
    if harness_us is None or not plain:
        return None
    plain_us = statistics.fmean(plain)
    ratio = harness_us / plain_us
    interval = level_interval(harness_processes, plain)
    low, high = interval if interval else (None, None)
    warning = None
    if abs(ratio - 1) > warn:
        way = "slower" if ratio > 1 else "faster"
        said = (
            f"the harness's baseline ran {100 * abs(ratio - 1):.0f}% {way} than the script as a plain "
            f"process ({harness_us / 1e3:.3g} ms against {plain_us / 1e3:.3g} ms a step"
        )
        ci = f"95% CI of the ratio {low:.2f}–{high:.2f}×" if low is not None and high is not None else None
        then = (
            "the proof's figure is the one you get"
            if proven
            else "no proof timed a change as you run it, so its verdicts stand on that level"
        )
        if low is not None and high is not None and low <= 1 <= high:
            warning = (
                f"{said}), not told from the noise of so few processes ({ci}; the harness's "
                f"{len(harness_processes)} up to {spread_pct(harness_processes) or 0:.0f}% apart, the script's "
                f"{len(plain)} up to {spread_pct(plain) or 0:.0f}%): {then}"
            )
        else:
            warning = (
                f"{said}{'; ' + ci if ci else ''}): its savings were measured against that level; {then}"
            )
    return HarnessLevel(harness_us, plain_us, ratio, warning, low, high)


def script_means(proof: Proof | None) -> list[float]:
    """The mean steps of the proof's processes of the script as written."""
    if proof is None:
        return []
    return [p.mean_step_us for p in proof.processes if p.side == "script" and p.mean_step_us]


def level_interval(harness: Sequence[float], plain: Sequence[float]) -> tuple[float, float] | None:
    """The 95% interval of the harness's level over plain processes' (Welch's t on the processes' log
    mean steps); None under two processes on a side."""
    if len(harness) < 2 or len(plain) < 2 or min(*harness, *plain) <= 0:
        return None
    lh, lp = [math.log(v) for v in harness], [math.log(v) for v in plain]
    vh, vp = statistics.variance(lh) / len(lh), statistics.variance(lp) / len(lp)
    center = statistics.fmean(lh) - statistics.fmean(lp)
    if vh + vp == 0:
        return math.exp(center), math.exp(center)
    df = (vh + vp) ** 2 / (vh**2 / (len(lh) - 1) + vp**2 / (len(lp) - 1))
    t = t_quantile(0.975, df) * math.sqrt(vh + vp)
    return math.exp(center - t), math.exp(center + t)


def spread_pct(values: Sequence[float]) -> float | None:
    """(largest − smallest) / median of the processes' mean steps, in %; None under two processes."""
    if len(values) < 2:
        return None
    return 100 * (max(values) - min(values)) / statistics.median(values)


def speedup_of(saving_pct: float | None) -> float | None:
    return None if saving_pct is None or saving_pct >= 100 else 100 / (100 - saving_pct)


def disagreement(
    proof: Proof | None, saving_pct: float | None, ci_low_pct: float | None, ci_high_pct: float | None
) -> str | None:
    """Where the harness's saving and the proof's disagree beyond their intervals (the harness's own
    where it has one, else its figure against the proof's interval): by how much, in one line."""
    harness = speedup_of(saving_pct)
    if proof is None or proof.speedup is None or proof.speedup_low is None or harness is None:
        return None
    assert proof.speedup_high is not None
    low, high = speedup_of(ci_low_pct), speedup_of(ci_high_pct)
    h_low, h_high = (low, high) if low is not None and high is not None else (harness, harness)
    if h_low <= proof.speedup_high and h_high >= proof.speedup_low:
        return None
    by = 100 * (harness / proof.speedup - 1)
    return (
        f"the harness measured {harness:.2f}× and the proof {proof.speedup:.2f}× (95% CI "
        f"{proof.speedup_low:.2f}–{proof.speedup_high:.2f}×): they disagree beyond their intervals, the "
        f"harness's figure {abs(by):.0f}% {'above' if by > 0 else 'below'} what the script gets run plainly"
    )


def headline_of(proof: Proof | None, final: tuple[str, ...], saving_pct: float | None) -> Headline | None:
    """The report's headline figure: the proof's where it timed pairs, else the harness's."""
    harness = speedup_of(saving_pct)
    if proof is not None and proof.recommended is not None:
        return Headline(
            "proof", proof.recommended, proof.speedup, proof.speedup_low, proof.speedup_high, harness
        )
    if not final:
        return None
    return Headline("harness", True, harness, None, None, harness)


def clocks_note(processes: Sequence[PlainProcess]) -> str | None:
    """What the GPU's clocks and the host did while the two sides were timed, where it could bend the
    proof: a reason that lowers clocks (power cap, heat) active in a side's samples, or the two sides'
    mean SM clocks apart; other processes' cores, the hypervisor's steal, the host's probe spread
    (`_host_parts`). None where all held, or nothing was read."""
    parts: list[str] = []
    means: dict[str, float] = {}
    top = None
    for side, label in (("script", "the script"), ("patched", "the patched copy")):
        read = [p.clocks for p in processes if p.side == side and p.clocks is not None and p.clocks.samples]
        n = sum(c.samples for c in read)
        if not n:
            continue
        shares: dict[str, float] = {}
        for c in read:
            for reason, share in c.slowdowns:
                shares[reason] = shares.get(reason, 0.0) + share * c.samples / n
        held = sorted(((v, k) for k, v in shares.items() if v >= SLOWDOWN_SHARE), reverse=True)
        if held:
            parts.append(f"{label}: " + ", ".join(f"{k} in {v:.0%} of its samples" for v, k in held))
        weighted = [(c.sm_mean_mhz, c.samples) for c in read if c.sm_mean_mhz is not None]
        if weighted:
            means[side] = sum(m * k for m, k in weighted) / sum(k for _, k in weighted)
        top = top or next((c.sm_max_mhz for c in read if c.sm_max_mhz), None)
    if len(means) == 2 and abs(means["script"] - means["patched"]) > CLOCK_GAP * max(means.values()):
        parts.append(
            f"SM clock {means['script']:,.0f} MHz under the script, {means['patched']:,.0f} under the patched "
            f"copy" + (f" (its maximum {top:,} MHz)" if top else "")
        )
    host = _host_parts(processes)
    said = ["the GPU's clocks while the steps were timed: " + "; ".join(parts)] if parts else []
    if host:
        said.append("the host while they were timed: " + "; ".join(host))
    return " — ".join(said) or None


def _host_parts(processes: Sequence[PlainProcess]) -> list[str]:
    """The host's part of `clocks_note`: other processes' cores or the hypervisor's steal past their
    thresholds under a side, and the probe's spread over the processes past PROBE_SPREAD."""
    parts: list[str] = []
    for field, limit, words in (("others_cores", OTHERS_CORES, "other processes kept {:.1f} cores busy under {}"),
                                ("steal_cores", STEAL_CORES, "the hypervisor took {:.1f} cores under {}")):  # fmt: skip
        said: list[tuple[float, str]] = []
        for side, label in (("script", "the script"), ("patched", "the patched copy")):
            values = [(getattr(p.clocks, field), p.clocks.host_samples) for p in processes
                      if p.side == side and p.clocks is not None and p.clocks.host_samples
                      and getattr(p.clocks, field) is not None]  # fmt: skip
            mean = sum(v * k for v, k in values) / sum(k for _, k in values) if values else 0.0
            if mean >= limit:
                said.append((mean, label))
        if said:  # "other processes kept 1.0 cores busy under the script, 0.8 under the patched copy"
            parts.append(
                words.format(*said[0]) + "".join(f", {v:.1f} under {label}" for v, label in said[1:])
            )
    probes = {side: [p.clocks.probe_us for p in processes if p.side == side and p.clocks and p.clocks.probe_us]
              for side in ("script", "patched")}  # fmt: skip
    every = probes["script"] + probes["patched"]
    if every and max(every) >= PROBE_SPREAD * min(every):
        ranges = ", ".join(f"{label} {min(v):,.0f}–{max(v):,.0f} µs" for label, v in
                           (("the script's", probes["script"]), ("the patched copy's", probes["patched"])) if v)  # fmt: skip
        parts.append(
            f"a fixed Python loop took up to {max(every) / min(every):.2f}× longer in one process than in "
            f"another ({ranges}): the host's speed changed, and a host-bound step changes with it"
        )
    return parts
