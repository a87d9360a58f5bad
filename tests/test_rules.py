"""The doctor on the recorded traces: what it names first, how it ranks, and how the step time
measured without the profiler changes its verdict. (The planted-bottleneck zoo is tests/test_zoo.py.)"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.rules import Diagnosis, Severity, diagnose
from gpudoctor.trace import load_trace

TRACES = Path(__file__).parent / "fixtures" / "traces"
MANIFEST = json.loads((TRACES / "manifest.json").read_text())["fixtures"]


@functools.cache
def diagnosis(name: str, unprofiled: bool = True) -> Diagnosis:
    step = MANIFEST[name]["unprofiled_step_us"]["median"] if unprofiled else None
    return diagnose(analyze(load_trace(TRACES / f"{name}.json.gz"), unprofiled_step_us=step))


@pytest.mark.parametrize(
    ("name", "first"),
    [
        ("dataloader_bound", "input_pipeline"),
        ("sync_every_step", "tensor_cores_unused"),
    ],
)
def test_the_first_finding_is_the_main_cause(name: str, first: str) -> None:
    d = diagnosis(name)
    assert d.findings[0].id == first
    assert d.findings[0].severity is Severity.CRITICAL


def test_inference_copies_and_syncs_come_first() -> None:
    # Each step copies a pageable batch in (blocking) and its result out with .cpu() (a sync): both
    # serialize host and GPU, and either fix wins back about the same.
    d = diagnosis("inference")
    assert {f.id for f in d.findings[:2]} == {"pageable_copy", "host_sync"}
    assert all(f.severity is Severity.CRITICAL for f in d.findings[:2])


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_findings_are_ranked_and_bounded(name: str) -> None:
    d = diagnosis(name)
    savings = [f.est_saving_pct for f in d.findings]
    assert savings == sorted(savings, reverse=True)
    assert all(0 <= s <= 100 for s in savings)
    assert len({f.id for f in d.findings}) == len(d.findings)
    assert all(f.evidence and f.fix.summary and f.fix.snippet for f in d.findings)
    assert Diagnosis.from_json(json.loads(json.dumps(d.to_json()))) == d


def test_the_syncs_are_named_with_their_source_line() -> None:
    f = diagnosis("sync_every_step_stack").get("host_sync")
    assert f is not None and f.sources == ("gpudoctor/workloads/sync_every_step.py(26): run",)
    assert "aten::item" in f.evidence[0]


def test_profiler_overhead_is_taken_out() -> None:
    # Profiled, the transformer step looks host-bound (launch overhead up to 18% of the traced step);
    # measured without the profiler its GPU is busy 94% of the step: a minor finding and an info about
    # the distortion. On the trace alone the profiler's cost is estimated from what it recorded, and the
    # finding is judged without it: minor, not major, with the saving the trace bounds still shown.
    traced, real = diagnosis("transformer_train", unprofiled=False), diagnosis("transformer_train")
    seen, actual = traced.get("launch_overhead"), real.get("launch_overhead")
    assert seen is not None and seen.est_saving_pct >= 8 and seen.severity is Severity.MINOR
    assert seen.values["saving_without_profiler_pct"] < 8
    assert any("profiler_distortion" in e and "gpudoctor run" in e for e in seen.evidence)
    assert actual is not None and actual.severity in (Severity.MINOR, Severity.INFO)
    assert actual.est_saving_pct < seen.est_saving_pct / 3
    assert real.get("profiler_distortion") is not None
    estimated = traced.get("profiler_distortion")
    assert estimated is not None and estimated.values["est_profiler_us"] > 0
    assert real.bound.startswith("GPU-bound") and not traced.bound.startswith("GPU-bound")
    assert "The profiler itself may account for" in traced.bound


def test_a_cpu_only_analysis_has_nothing_to_diagnose() -> None:
    d = diagnose(Analysis.from_json(_cpu_only()))
    assert d.findings == () and "No GPU activity" in d.bound


def _cpu_only() -> dict:
    doc = copy.deepcopy(analyze(load_trace(TRACES / "inference.json.gz")).to_json())
    doc["timeline"] = {"steps": [], "profiled_steps": None, "gpu_window": None, "concurrent_kinds_us": {}}
    doc["steps"] = [{**s, "gpu": None} for s in doc["steps"]]
    return doc


def test_data_parallel_needs_work_on_several_devices(tmp_path: Path) -> None:
    import gzip

    doc = json.loads(gzip.decompress((TRACES / "conv_bf16_train.json.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    for e in kernels[::2]:  # half the kernels now run on a second GPU of the same process
        e["args"]["device"] = 1
    path = tmp_path / "dp.json"
    path.write_text(json.dumps(doc))
    d = diagnose(analyze(load_trace(path)))
    f = d.get("data_parallel")
    assert f is not None and "2 devices" in f.evidence[0]
    assert diagnosis("conv_bf16_train").get("data_parallel") is None


def test_a_few_kernels_without_steps_are_not_diagnosed(tmp_path: Path) -> None:
    import gzip

    doc = json.loads(gzip.decompress((TRACES / "sync_every_step.json.gz").read_bytes()))
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")][:3]
    keep = {id(e) for e in gpu}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) in keep or e.get("cat") == "cuda_runtime"]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doc))
    d = diagnose(analyze(load_trace(path)))
    assert d.findings == () and d.bound.startswith("Too little GPU work")


DEMO_RUN = Path(__file__).parent / "fixtures" / "runs" / "demo_h100"  # `gpudoctor demo` on the H100


def test_tensor_cores_unused_weighs_the_kernels_against_the_measured_ceilings() -> None:
    # GIVEN the demo's float32 MLP, recorded with shapes on an H100 (whose ceilings gpudoctor measured)
    observer = json.loads((DEMO_RUN / "observer.json").read_text())
    a = analyze(load_trace(DEMO_RUN / "trace.json.gz"), unprofiled_step_us=observer["light_median_us"])
    # WHEN diagnosed
    finding = next(f for f in diagnose(a).findings if f.id == "tensor_cores_unused")
    # THEN the evidence says how close the float32 kernels are to the float32 ceiling, from the roofline
    assert a.roofline is not None and a.roofline.ceilings is not None
    fp32 = [p for p in a.roofline.points if p.dtype == "float32" and p.family == "matmul"]
    share = (
        sum(p.flops for p in fp32)
        / (sum(p.time_us for p in fp32) / 1e6)
        / a.roofline.ceilings.flops["float32"]
    )
    assert 0.8 < share < 1.1  # SIMT sgemms run at their limit
    line = finding.evidence[1]
    assert f"{share * 100:.0f}% of the GPU's measured float32 ceiling (51.6 TFLOP/s)" in line
    assert "bfloat16 ceiling is 796 TFLOP/s, 15× higher" in line


def test_tensor_cores_unused_without_shapes_says_it_in_general_terms() -> None:
    # GIVEN a trace with float32 matmuls recorded without record_shapes THEN no ceiling figures
    finding = next(f for f in diagnosis("sync_every_step").findings if f.id == "tensor_cores_unused")
    assert finding.evidence[1] == "bfloat16 tensor cores run such work an order of magnitude faster."


def test_float32_convolutions_on_tf32_tensor_cores_are_worth_bfloat16() -> None:
    # GIVEN ResNet-50 inference in float32 (recorded on an H200): cuDNN runs its convolutions in TF32 on the
    # tensor cores (cuDNN's default), so no kernel is a SIMT float32 one
    d = diagnosis("inference")
    assert d.get("tensor_cores_unused") is None
    f = d.get("tf32_not_bf16")
    # THEN the TF32 matmul and convolution time is worth bfloat16: the share bfloat16's tensor cores take
    # off it (by the H200's measured matmul ceilings, 786 against 409 TFLOP/s), of the unprofiled step
    assert f is not None
    tf32_us, ratio, step = f.values["tf32_matmul_conv_us"], f.values["bf16_over_tf32"], f.values["step_us"]
    assert ratio == pytest.approx(785.6 / 408.7, abs=1e-3)
    assert "(NVIDIA H200's measured matmul ceilings)" in f.evidence[1]
    assert f.est_saving_pct == pytest.approx(100 * (1 - 1 / ratio) * tf32_us / step, abs=0.05)
    assert "in TF32 on the tensor cores, e.g. sm80_xmma_fprop" in f.evidence[0]
    # AND a model already under bfloat16 autocast has no such finding
    assert diagnosis("conv_bf16_train").get("tf32_not_bf16") is None


def test_bfloat16_and_half_kernels_are_not_taken_for_tf32() -> None:
    from gpudoctor.analysis.classify import is_tf32 as tf32

    assert tf32("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32")
    assert tf32("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4>")
    assert not tf32(
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x128_32x3_tn_align8>"
    )
    assert not tf32("cutlass_80_tensorop_h1688gemm_64x64_32x6_tn_align8")
    assert not tf32("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")
    assert not tf32("ampere_sgemm_128x64_tn")


DDP = Path(__file__).parent / "fixtures" / "ddp"  # tools/record_ddp.py: 2 H200s, rank 1 a straggler


@functools.cache
def ddp_diagnosis(rank: int) -> Diagnosis:
    manifest = json.loads((DDP / "manifest.json").read_text())["ranks"][f"rank{rank}"]
    trace = load_trace(DDP / f"rank{rank}.json.gz")
    return diagnose(analyze(trace, unprofiled_step_us=manifest["unprofiled_step_us"]["median"]))


def test_the_rank_waiting_on_a_straggler_is_diagnosed_as_exposed_communication() -> None:
    # GIVEN rank 0 of a DDP run whose rank 1 does 8 ms of extra host work per step
    d = ddp_diagnosis(0)
    # THEN its first finding is the all-reduce with no compute beside it, waiting (uneven durations),
    # and the NCCL kernel's few thread blocks do not pass for a batch too small
    first = d.findings[0]
    assert first.id == "communication_exposed" and first.severity is Severity.CRITICAL
    assert "waiting for a slower rank" in first.evidence[1]
    assert "small_batch" not in {f.id for f in d.findings}
    assert d.bound.startswith("Communication-bound")


def test_the_straggler_rank_is_diagnosed_as_python_between_ops_not_launch_overhead() -> None:
    # GIVEN the straggler rank: its GPU waits for a host that spends ~8 ms per step in its own code
    d = ddp_diagnosis(1)
    first = d.findings[0]
    # THEN that Python comes first, with the ranks that wait for it named
    assert first.id == "host_python" and first.severity is Severity.CRITICAL
    assert "Python between the ops" in first.evidence[0]
    assert "they wait for it in their collectives" in first.evidence[2]
    # AND launch_overhead does not promise a CUDA graph the time of that Python
    launch = next(f for f in d.findings if f.id == "launch_overhead")
    assert "outside PyTorch ops" in launch.evidence[2]
    assert launch.est_saving_pct < first.est_saving_pct
    assert d.bound.startswith("The GPU idles")


def test_python_between_ops_is_not_claimed_where_the_gpu_does_not_wait() -> None:
    # GIVEN rank 0, which runs the same script without the planted host work THEN no host_python
    assert "host_python" not in {f.id for f in ddp_diagnosis(0).findings}


DDP_STACK = Path(__file__).parent / "fixtures" / "ddp_stack"  # the same, with_stack, rank 1 sleeping 8 ms


def test_python_between_ops_is_put_on_the_users_frame_that_holds_it() -> None:
    # GIVEN the straggler rank recorded with Python stacks, its 8 ms per step in straggle()
    manifest = json.loads((DDP_STACK / "manifest.json").read_text())["ranks"]["rank1"]
    a = analyze(
        load_trace(DDP_STACK / "rank1.json.gz"), unprofiled_step_us=manifest["unprofiled_step_us"]["median"]
    )
    # THEN the analysis puts most of the host's time between ops on that frame, about 8 ms per step
    assert a.host_gaps and a.host_gaps[0].frame.endswith(": straggle")
    assert 7_000 < a.host_gaps[0].us_per_step < 10_000
    # AND host_python, the first finding, names it as its source
    first = diagnose(a).findings[0]
    assert first.id == "host_python"
    assert first.sources[0] == a.host_gaps[0].frame
    assert any("straggle" in e and "per step" in e for e in first.evidence)
