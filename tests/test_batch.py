"""`gpudoctor batch`: setting an unmodified script's batch size from outside, the memory model and
the largest batch it predicts, the throughput knee, the latency target, the sweep's choice of sizes on
injected measurements (models with a known answer), and an end-to-end sweep on the CPU."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import torch
from typer.testing import CliRunner

from gpudoctor.analysis.batch import BatchPoint, BatchSweep, find_knee, fit_memory, latency_pick
from gpudoctor.analysis.batch_plan import SweepPlan, next_batch, step_above, sweep
from gpudoctor.cli.main import app
from gpudoctor.runner.batch import measure_batch
from gpudoctor.runner.batch_knob import BatchKnob
from gpudoctor.util.errors import UsageError

GiB = 1 << 30


# -- the knob -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flag", "extra"),
    [
        ("--batch-size", "--lr"),
        ("--bs", "--lr"),
        ("--per_device_train_batch_size", "--lr"),
        ("--batch_size", "--bsz"),
    ],
)
def test_a_batch_size_option_is_found_and_set(flag: str, extra: str) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(extra, type=float, default=0.1)
    parser.add_argument(flag, type=int, default=32)
    knob = BatchKnob(64).install()
    try:
        ns = parser.parse_args([])
    finally:
        knob.uninstall()
    assert vars(ns)[flag.lstrip("-").replace("-", "_")] == 64
    assert knob.applied == {
        "kind": "option",
        "option": flag,
        "dest": flag.lstrip("-").replace("-", "_"),
        "default": 32,
    }


def test_a_subclassed_parser_and_an_option_given_on_the_command_line_are_set_too() -> None:
    class HfLikeParser(argparse.ArgumentParser):
        pass

    parser = HfLikeParser()
    parser.add_argument("--mb", type=int, default=4)
    knob = BatchKnob(8, option="mb").install()
    try:
        ns, rest = parser.parse_known_args(["--mb", "2", "--other"])
    finally:
        knob.uninstall()
    assert ns.mb == 8 and rest == ["--other"] and knob.applied is not None and knob.applied["default"] == 2


def test_dataloaders_get_the_size_unless_an_option_set_it_or_a_batch_sampler_batches() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(100))
    original = torch.utils.data.DataLoader.__init__
    knob = BatchKnob(7).install()
    try:
        by_keyword = torch.utils.data.DataLoader(data, batch_size=32)
        by_position = torch.utils.data.DataLoader(data, 16, shuffle=False)
        sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(data), 5, False)
        batched = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    finally:
        knob.uninstall()
    assert (by_keyword.batch_size, by_position.batch_size, batched.batch_size) == (7, 7, None)
    assert knob.applied == {
        "kind": "dataloader",
        "option": None,
        "dest": None,
        "default": 32,
        "loaders": 2,
        "samples": 100,
    }
    assert torch.utils.data.DataLoader.__init__ is original
    assert argparse.ArgumentParser.parse_known_args.__qualname__ == "ArgumentParser.parse_known_args"


# -- what the points say ----------------------------------------------------------------------------
def _points(sizes: list[int], step_us: Any, peak: Any = None, budget: int | None = None) -> list[BatchPoint]:
    out = []
    for b in sizes:
        need = peak(b) if peak else None
        status = "oom" if need is not None and budget is not None and need > budget else "ok"
        out.append(
            BatchPoint(b, status, step_us(b) if status == "ok" else None, need if status == "ok" else None)
        )
    return out


def test_the_memory_model_is_the_line_through_the_two_largest_sizes() -> None:
    pts = _points(
        [1, 2, 64, 128], lambda b: 1000.0, lambda b: 2 * GiB + 300_000_000 * b + (10**8 if b < 8 else 0)
    )
    m = fit_memory(pts)
    assert m is not None and m.batches == (64, 128)
    assert (m.fixed, m.per_sample) == (pytest.approx(2 * GiB), pytest.approx(300_000_000))
    assert m.largest(80 * GiB) == int((80 * GiB * 0.98 - 2 * GiB) // 300_000_000)
    assert fit_memory(pts[:1]) is None


def _saturating(t0_us: float, per_sample_us: float) -> Any:
    return lambda b: t0_us + per_sample_us * b


def test_the_knee_is_where_a_doubling_stops_gaining_ten_percent() -> None:
    pts = _points([1, 2, 4, 8, 16, 32, 64, 128, 256], _saturating(10_000, 500))
    knee = find_knee(pts)
    # gain per doubling from b: 2(t0 + b c) / (t0 + 2 b c) - 1: 13.5% at 64, 7.2% at 128
    assert knee is not None and knee.batch == 128 and knee.gain == pytest.approx(2 * 74 / 138 - 1)


def test_one_noisy_dip_followed_by_growth_is_no_knee() -> None:
    times = {1: 1000.0, 2: 1000.0, 4: 3000.0, 8: 1000.0, 16: 1000.0}  # 4 is an outlier
    assert find_knee(_points(list(times), times.__getitem__)) is None


def _canned(step_times: Any) -> Any:
    """A sweep's `measure` on the CPU fed canned step times: `step_times(b)` is the list for size b."""
    knob = {"kind": "option", "option": "--batch-size", "default": 16}
    calls: list[int] = []

    def measure(b: int) -> dict[str, Any]:
        calls.append(b)
        return {"batch": b, "knob": knob, "status": "ok", "step_times_us": step_times(b), "training": True}

    measure.calls = calls  # type: ignore[attr-defined]
    return measure


def _steady(t_us: float, jitter: float = 0.03) -> list[float]:
    """Ten steps within ±jitter of t_us."""
    return [t_us * (1 + jitter * ((i % 5) - 2) / 2) for i in range(10)]


def test_one_slow_point_in_the_middle_of_the_doublings_does_not_make_the_knee() -> None:
    truth = _saturating(10_000, 500)  # the knee is at 128 (see above)

    def times(b: int) -> list[float]:  # 16's process ran 5x slower throughout: no spread shows it
        return _steady(truth(b) * (5 if b == 16 else 1))

    measure = _canned(times)
    s = sweep(measure, SweepPlan(), ["train.py"])
    # THEN the sweep went on past 16 (one size past a candidate knee at 8 is not enough to stop)
    assert 32 in measure.calls and 64 in measure.calls
    # AND the knee is the real one, confirmed on two larger sizes
    assert s.knee is not None and s.knee.batch == 128 and s.knee.sizes_past == 2


def test_a_noisy_point_at_the_end_is_no_knee_but_a_real_plateau_is() -> None:
    # a busy machine: 6 of 8's 10 steps stall 60x (the median is a stall), 4 run at full speed
    def noisy(b: int) -> list[float]:
        t = 1000.0 * (1 + b / 64)  # still growing fast up to 8
        return _steady(t) if b < 8 else [t] * 4 + [60 * t] * 6

    s = sweep(_canned(noisy), SweepPlan(max_batch=8), ["train.py"])
    assert [p.batch for p in s.points] == [1, 2, 4, 8] and s.points[-1].throughput < s.points[-2].throughput
    assert s.knee is None  # 8's drop is within its own noise
    # a real plateau from 32 on, measured with the same few-percent jitter as every point: a knee at 32
    plateau = _canned(lambda b: _steady(1000.0 * max(1, b / 32)))
    s = sweep(plateau, SweepPlan(), ["train.py"])
    assert s.knee is not None and s.knee.batch == 32 and s.knee.sizes_past == 2
    assert plateau.calls[-2:] == [64, 128]  # two sizes past the knee, then done


def test_latency_pick_and_the_sublinear_region() -> None:
    pts = _points([1, 2, 4, 8, 16, 32, 64, 128, 256], _saturating(5_000, 200))
    assert latency_pick(pts, 20_000) == 64 and latency_pick(pts, 1_000) is None
    knee = find_knee(pts)
    s = BatchSweep(
        "gpudoctor.batch/1", ("x",), {}, False, None, None, None, tuple(pts), None, None, 256, None, knee
    )
    assert knee is not None and s.sublinear_until == knee.batch


# -- the plan, on models with a known answer -------------------------------------------------------
def _model(fixed: int, per_sample: int, budget: int, t0: float, c: float, training: bool = True) -> Any:
    calls: list[int] = []

    def measure(b: int) -> dict[str, Any]:
        calls.append(b)
        need = fixed + per_sample * b
        base = {
            "batch": b,
            "knob": {"kind": "option", "option": "--batch-size", "default": 16},
            "training": training,
            "budget": budget,
            "capacity": budget + GiB,
            "device": "model",
        }
        if need > budget:
            return {**base, "status": "oom", "error": "OutOfMemoryError"}
        return {
            **base,
            "status": "ok",
            "step_times_us": [t0 + c * b] * 5,
            "peak_allocated": need,
            "peak_reserved": need,
        }

    measure.calls = calls  # type: ignore[attr-defined]
    return measure


def test_a_training_sweep_doubles_then_confirms_the_predicted_largest_batch() -> None:
    fixed, per, budget = 2 * GiB, 300_000_000, 80 * GiB
    truth = int((budget - fixed) // per)
    measure = _model(fixed, per, budget, 10_000, 500)
    s = sweep(measure, SweepPlan(), ["train.py"])
    assert s.predicted_max is not None and abs(s.predicted_max - truth) <= 0.03 * truth  # the 2% headroom
    assert (
        s.prediction_tried in measure.calls
        and s.prediction_tried + step_above(s.prediction_tried) in measure.calls
    )
    assert s.prediction_tried is not None and abs(s.prediction_tried - truth) <= 0.03 * truth
    assert s.largest_fit is not None and s.largest_fit >= s.predicted_max
    assert s.knee is not None and s.training and len(measure.calls) <= 14


def test_an_optimistic_prediction_is_bisected_down_to_one_step() -> None:
    fixed, per, budget = 2 * GiB, 300_000_000, 80 * GiB
    base = _model(fixed, per, budget, 10_000, 500)

    def superlinear(b: int) -> dict[str, Any]:  # a workspace that appears above 200: the line underestimates
        raw = base(b)
        return {**raw, "status": "oom"} if b > 200 else raw

    s = sweep(superlinear, SweepPlan(), ["train.py"])
    assert s.largest_fit == 200 or (
        s.smallest_oom is not None and s.smallest_oom - s.largest_fit <= step_above(200)
    )


def test_an_inference_sweep_finds_the_largest_batch_within_the_latency_target() -> None:
    measure = _model(GiB, 20_000_000, 80 * GiB, 5_000, 200, training=False)
    s = sweep(measure, SweepPlan(latency_target_us=20_000), ["serve.py"])
    truth = 75  # 5 ms + 0.2 ms × 75 = 20 ms
    assert s.latency_pick is not None and truth - max(1, truth // 8) <= s.latency_pick <= truth
    assert not s.training and s.sublinear_until is not None


def test_a_first_size_out_of_memory_is_halved_until_one_fits() -> None:
    measure = _model(2 * GiB, 10 * GiB, 80 * GiB, 1000, 10)
    s = sweep(measure, SweepPlan(start=64), ["train.py"])
    assert measure.calls[:5] == [64, 32, 16, 8, 4]
    assert (s.largest_fit, s.smallest_oom) == (7, 8)  # 2 GiB + 10 GiB per sample within 80 GiB


def test_a_script_without_a_batch_size_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no batch size to sweep"):
        sweep(
            lambda b: {"batch": b, "status": "ok", "knob": None, "step_times_us": [1.0]},
            SweepPlan(),
            ["x.py"],
        )
    with pytest.raises(UsageError, match="failed at batch 1"):
        sweep(lambda b: {"batch": b, "status": "error", "error": "boom"}, SweepPlan(), ["x.py"])


def test_a_size_that_fails_is_not_measured_again_and_a_first_size_that_fails_is_an_error() -> None:
    knob = {"kind": "option", "option": "--batch-size", "default": 16}

    def failing(b: int) -> dict[str, Any]:  # on the CPU (no memory budget), an error past 300
        if b > 300:
            return {"batch": b, "knob": knob, "status": "error", "error": "RuntimeError: cuDNN error"}
        return {"batch": b, "knob": knob, "status": "ok", "step_times_us": [1000.0 + 10 * b] * 5}

    s = sweep(failing, SweepPlan(start=300), ["train.py"])
    tried = [p.batch for p in s.points]
    # THEN no size is measured twice (it once spent every run on 600, failing alike)
    assert len(tried) == len(set(tried)) and 600 in tried
    # AND a script that times no step at its first size (an argparse error, say) is an error saying why
    no_step = {"knob": knob, "status": "no_steps", "error": "no step was timed; its last output: error: bad"}
    with pytest.raises(UsageError, match="failed at batch 8: no step was timed; its last output: error: bad"):
        sweep(lambda b: {**no_step, "batch": b}, SweepPlan(start=8), ["train.py"])


def test_a_runtime_error_out_of_memory_is_out_of_memory() -> None:
    from gpudoctor.runner.batch import _out_of_memory

    assert _out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not _out_of_memory(RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"))


def test_next_batch_stops_at_the_run_limit() -> None:
    pts = _points([1, 2, 4], _saturating(1000, 1))
    assert next_batch(pts, SweepPlan(max_runs=3), None) is None
    assert next_batch(pts, SweepPlan(max_runs=4), None) == 8
    assert math.isclose(step_above(300), 16) and step_above(3) == 1


# -- end to end on the CPU --------------------------------------------------------------------------
LOADER_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
loader = DataLoader(data, batch_size=16)
model = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(5):
    for x, y in loader:
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_dataloader_script_is_measured_at_the_patched_size(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(LOADER_SCRIPT)
    point = measure_batch(str(script), [], 64, warmup=1, light_steps=3, light_seconds=0.0, warmup_seconds=0.0)
    assert (
        point["status"] == "ok" and point["knob"]["kind"] == "dataloader" and point["knob"]["default"] == 16
    )
    assert len(point["step_times_us"]) >= 3 and point["training"] is True
    assert point["peak_allocated"] is None  # no CUDA: no allocator peaks


ARG_SCRIPT = """\
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
args = parser.parse_args()
model = torch.nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(300):
    loss = model(torch.randn(args.batch_size, 32)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


SHORT_TRAIN = """\
import torch
model = torch.nn.Linear(16, 1)
for _ in range(60):  # ends inside the light phase: no memory record (the label flipped on that)
    loss = model(torch.randn(8, 16)).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
"""

INFERENCE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(256, 16)), batch_size=8)
model = torch.nn.Linear(16, 1).eval()
with torch.{mode}():
    for _ in range(2):
        for (x,) in loader:
            model(x)
"""


@pytest.mark.parametrize(
    ("source", "training"),
    [
        (LOADER_SCRIPT, True),  # optimizer.step()
        (ARG_SCRIPT, True),  # optimizer.step(), no DataLoader: read "inference" when it ended first
        (SHORT_TRAIN, True),  # backward() and a hand-written update, no optimizer, script ends early
        (INFERENCE.format(mode="no_grad"), False),
        (INFERENCE.format(mode="inference_mode"), False),
    ],
)
def test_training_is_backward_or_an_optimizer_step_however_far_the_light_phase_got(
    tmp_path: Path, source: str, training: bool
) -> None:
    script = tmp_path / "script.py"
    script.write_text(source)
    original = (torch.Tensor.backward, torch.autograd.backward)
    for light_steps in (2, 1000):  # the light phase ends and stops the script, or the script ends first
        point = measure_batch(str(script), [], 8, warmup=1, light_steps=light_steps, light_seconds=0.0)
        assert point["status"] == "ok" and point["training"] is training, (light_steps, point)
    assert (torch.Tensor.backward, torch.autograd.backward) == original  # the watch is undone


@pytest.mark.slow
def test_gpudoctor_batch_sweeps_a_script_in_fresh_processes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ARG_SCRIPT)
    out = tmp_path / "sweep"
    args = ["batch", "--out", str(out), "--max", "4", "--light-steps", "3", "--warmup", "1", str(script)]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    s = BatchSweep.from_json(json.loads((out / "batch.json").read_text()))
    assert [p.batch for p in s.points] == [1, 2, 4] and all(p.fits and p.step_us for p in s.points)
    assert s.knob["option"] == "--batch-size" and s.knob["default"] == 4
    html = (out / "batch.html").read_text()
    assert "<svg" in html and "Throughput" in html and "Batch sizes" in result.output
    ElementTree.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])


def test_the_html_page_draws_throughput_memory_and_latency_with_their_marks() -> None:
    from gpudoctor.analysis.batch import summarize
    from gpudoctor.report.batch_view import render_html

    pts = _points(
        [1, 2, 4, 8, 16, 32, 64, 128, 256], _saturating(5_000, 200), lambda b: GiB + 20_000_000 * b, 80 * GiB
    )
    s = summarize(
        pts,
        script=["serve.py"],
        knob={"kind": "option", "option": "--bs", "default": 1},
        training=False,
        device="H100",
        capacity=81 * GiB,
        budget=80 * GiB,
        latency_target_us=20_000,
    )
    html = render_html(s)
    charts = [html[i : html.index("</svg>", i) + 6] for i in range(len(html)) if html.startswith("<svg", i)]
    assert len(charts) == 3  # throughput, peak memory, latency
    for chart in charts:
        ElementTree.fromstring(chart)
    assert "knee 128" in charts[0] and "allocator budget 80 GiB" in charts[1] and "target 20 ms" in charts[2]
    assert "sublinear" in charts[2] and "the largest batch meeting it is 64 (17.8 ms)" in html


def test_the_sentences_name_noisy_points_and_a_knee_seen_on_one_size_only() -> None:
    from gpudoctor.analysis.batch import point_of, summarize
    from gpudoctor.report.batch_view import sentences

    def raw(b: int, times: list[float]) -> dict[str, Any]:
        return {"batch": b, "status": "ok", "step_times_us": times}

    steady = [raw(b, _steady(1000.0 * max(1, b / 4))) for b in (1, 2, 4, 8)]
    noisy = raw(16, [4000.0] * 4 + [9000.0] * 6)  # grows on its fast quartile, noisy
    s = summarize([point_of(r) for r in [*steady, noisy]], script=["x.py"], knob={}, training=True)
    text = " ".join(sentences(s))
    assert "Throughput knee at batch 4" in text and "a single point, unconfirmed" not in text
    assert "at batch 16 (4 ms–9 ms)" in text
    s = summarize([point_of(r) for r in steady], script=["x.py"], knob={}, training=True)
    assert s.knee is not None and s.knee.sizes_past == 1
    assert "a single point, unconfirmed" in " ".join(sentences(s))


def test_a_knee_past_which_the_throughput_more_than_halves_is_called_doubtful() -> None:
    from gpudoctor.analysis.batch import point_of, summarize
    from gpudoctor.report.batch_view import sentences

    def raw(b: int, t_us: float) -> dict[str, Any]:
        return {"batch": b, "status": "ok", "step_times_us": _steady(t_us)}

    # GIVEN a sweep whose two largest sizes ran while the machine was busy: 32 and 64 at 30x the step 16
    # took (a helper's trial, beside a test run on a 2-core machine: "doubling it loses 97%")
    busy = [raw(b, 1000.0 * max(1, b / 16) * (30 if b > 16 else 1)) for b in (4, 8, 16, 32, 64)]
    s = summarize([point_of(r) for r in busy], script=["x.py"], knob={}, training=True)
    # THEN the knee is reported as measured, and called doubtful with why
    assert s.knee is not None and s.knee.batch == 16 and s.knee.doubtful
    text = " ".join(sentences(s))
    assert "Throughput knee at batch 16" in text and "Doubtful" in text and "quiet machine" in text
    # AND a plateau as batches make one (the step grows as the batch) is not
    flat = [raw(b, 1000.0 * max(1, b / 16)) for b in (4, 8, 16, 32, 64)]
    s = summarize([point_of(r) for r in flat], script=["x.py"], knob={}, training=True)
    assert s.knee is not None and not s.knee.doubtful and "Doubtful" not in " ".join(sentences(s))


def test_start_above_max_is_a_one_line_error_before_any_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ARG_SCRIPT)
    args = ["batch", "--out", str(tmp_path / "o"), "--start", "64", "--max", "8", str(script)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--start 64 is above --max 8" in result.output
    assert "batch 64" not in result.output and not (tmp_path / "o").exists()


def test_one_size_that_ran_says_no_knee_can_be_told() -> None:
    from gpudoctor.analysis.batch import summarize
    from gpudoctor.report.batch_view import sentences

    s = summarize(_points([64], lambda b: 1000.0), script=["x.py"], knob={}, training=True)
    text = " ".join(sentences(s))
    assert "No knee can be told: fewer than two sizes ran." in text and "still grows" not in text
    s = summarize(_points([64], lambda b: 1000.0), script=["x.py"], knob={}, training=False)
    assert "sublinearly" not in " ".join(sentences(s))  # one inference size: nothing grows or not


def test_a_batch_above_the_dataloaders_dataset_is_no_point(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(LOADER_SCRIPT)  # 4096 samples: a batch of 8192 would hold 4096 and read 2x fast
    point = measure_batch(str(script), [], 8192, warmup=1, light_steps=3, light_seconds=0.0)
    assert point["status"] == "error" and point["step_times_us"] == []
    assert point["error"] == "the DataLoader's dataset holds 4096 samples, fewer than batch 8192"
