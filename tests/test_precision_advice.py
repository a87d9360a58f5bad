"""Advice that names a precision follows the device's compute capability (device.precision,
rules.precision): bfloat16 and TF32 from sm_80, float16 with a GradScaler on Volta and Turing, nothing
tensor-core before sm_70, bfloat16 on AMD's matrix cores; and Volta's cuDNN kernels are convolutions.
The V100 traces are recorded H100/H200 float32 traces rewritten by tools/derive_fixtures.py v100."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest

from gpudoctor.analysis.kernels import kernel_report
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.device.precision import (
    AMD,
    AMD_XF32,
    AMPERE_AND_LATER,
    MTIA,
    NO_TENSOR_CORES,
    UNKNOWN,
    VOLTA_TURING,
    capability_from_name,
    low_precision,
)
from gpudoctor.rules import Diagnosis, diagnose
from gpudoctor.trace import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
V100 = FIXTURES / "v100"
MANIFEST = json.loads((V100 / "manifest.json").read_text())


@functools.cache
def _analysis(path: Path) -> Analysis:
    return analyze(load_trace(path))


@functools.cache
def _diagnosis(path: Path) -> Diagnosis:
    return diagnose(_analysis(path))


@pytest.mark.parametrize(
    ("vendor", "capability", "arch", "name", "profile"),
    [
        ("NVIDIA", (9, 0), "sm_90", "NVIDIA H100 80GB HBM3", AMPERE_AND_LATER),
        ("NVIDIA", (8, 0), "sm_80", "NVIDIA A100-SXM4-40GB", AMPERE_AND_LATER),
        ("NVIDIA", (7, 5), "sm_75", "Tesla T4", VOLTA_TURING),
        ("NVIDIA", (7, 0), "sm_70", "Tesla V100-SXM2-16GB", VOLTA_TURING),
        ("NVIDIA", (6, 0), "sm_60", "Tesla P100-PCIE-16GB", NO_TENSOR_CORES),
        ("NVIDIA", None, None, "Tesla V100-PCIE-32GB", VOLTA_TURING),  # capability not recorded: the name
        ("AMD", (9, 0), "gfx90a", "AMD Instinct MI250X", AMD),
        ("AMD", (9, 4), "gfx942", "AMD Instinct MI300X", AMD_XF32),
        ("MTIA", None, None, "ARTEMIS", MTIA),
        (None, None, None, None, UNKNOWN),
    ],
)
def test_the_profile_follows_the_device(vendor, capability, arch, name, profile) -> None:
    assert low_precision(vendor, capability, arch, name) is profile


def test_each_profile_says_what_it_runs() -> None:
    assert (AMPERE_AND_LATER.dtype, AMPERE_AND_LATER.tf32, AMPERE_AND_LATER.grad_scaler) == (
        "bfloat16",
        True,
        False,
    )
    assert (VOLTA_TURING.dtype, VOLTA_TURING.tf32, VOLTA_TURING.grad_scaler) == ("float16", False, True)
    assert NO_TENSOR_CORES.tensor_cores is False
    assert AMD.dtype == "bfloat16" and not AMD.tf32 and AMD_XF32.tf32
    assert MTIA.autocast_device == "mtia"
    assert not UNKNOWN.known and capability_from_name("some GPU") is None


def test_the_v100_traces_are_what_their_manifest_says() -> None:
    for entry in MANIFEST["fixtures"].values():
        a = _analysis(V100 / entry["file"])
        assert a.device is not None and a.device.compute_capability == (7, 0)
        assert a.device.name == "Tesla V100-SXM2-16GB" and a.low_precision is VOLTA_TURING
        assert not any(
            n in k.name for k in a.kernels.top for n in ("sm80_", "sm90_", "tf32", "nvjet", "ampere")
        )


def test_a_v100_traces_tensor_core_fix_names_float16_and_a_grad_scaler() -> None:
    # GIVEN a float32 ResNet step on a V100 (sm_70): its convolutions run in SIMT float32 cuDNN kernels
    d = _diagnosis(V100 / MANIFEST["fixtures"]["inference_v100"]["file"])
    f = d.get("tensor_cores_unused")
    assert f is not None and f.est_saving_pct > 5
    # THEN the fix is float16 autocast with a GradScaler: the device has neither bfloat16 nor TF32
    fix = f.fix.summary + f.fix.snippet
    assert "torch.float16" in f.fix.snippet and "GradScaler" in fix and "scaler.scale(loss)" in fix
    assert not any(word in fix.lower() for word in ("bfloat16", "bf16", "tf32"))
    assert "sm_70" in " ".join(f.evidence)
    assert d.get("tf32_not_bf16") is None


@pytest.mark.parametrize("name", sorted(MANIFEST["fixtures"]))
def test_no_fix_on_a_v100_trace_names_bfloat16_or_tf32(name: str) -> None:
    d = _diagnosis(V100 / MANIFEST["fixtures"][name]["file"])
    assert d.findings
    for f in d.findings:
        fix = (f.fix.summary + f.fix.snippet).lower()
        assert not any(word in fix for word in ("bfloat16", "bf16", "tf32")), f.id


def test_volta_convolution_kernels_are_convolutions_without_tensor_cores() -> None:
    # GIVEN a float32 training step on a V100: forward, input-gradient and weight-gradient convolutions
    kernels = kernel_report(load_trace(V100 / MANIFEST["fixtures"]["dataloader_bound_v100"]["file"]), top=100)
    by_name = {k.name: k for k in kernels.top}

    def stat(prefix: str):
        return next(k for n, k in by_name.items() if n.startswith(prefix))

    for prefix in (
        "volta_scudnn_128x64_relu_interior_nn_v1",
        "volta_scudnn_128x128_stridedB_splitK_small_nn_v1",  # "splitK" alone would say matmul
        "void cudnn::detail::dgrad_engine<float",
        "void cudnn::detail::wgrad_alg0_engine<float",
        "void wgrad_alg0_engine<float",
    ):
        k = stat(prefix)
        assert (k.category, k.tensor_cores) == ("convolution", False), prefix
    # AND cuDNN's GEMM algorithm, named as a matmul, is a convolution where convolutions launch it, while
    # the classifier's own sgemm (from aten::addmm) stays a matmul
    assert stat("volta_sgemm_128x64_nn").category == "convolution"
    assert stat("volta_sgemm_64x64_nn").category == "matmul"
    # AND so all of its matmul and convolution time is float32 off the tensor cores
    assert kernels.tensor_core_share == 0.0
    assert kernels.no_tensor_core_us >= 0.7 * (kernels.convolution_us + kernels.matmul_us)


def test_an_ampere_or_later_trace_keeps_bfloat16_and_tf32() -> None:
    zoo = json.loads((FIXTURES / "zoo" / "manifest.json").read_text())["cases"]
    d = _diagnosis(FIXTURES / "zoo" / zoo["tensor_cores_unused"]["slow"]["file"])
    f = d.get("tensor_cores_unused")
    assert (
        f is not None
        and "torch.bfloat16" in f.fix.snippet
        and "set_float32_matmul_precision" in f.fix.snippet
    )
    assert "GradScaler" not in f.fix.snippet


def test_before_volta_there_is_no_tensor_core_finding() -> None:
    # GIVEN the V100 trace as a P100 (sm_60, no tensor cores) would have recorded it
    a = _analysis(V100 / MANIFEST["fixtures"]["inference_v100"]["file"])
    assert a.device is not None
    p100 = dataclasses.replace(a, device=dataclasses.replace(a.device, compute_capability=(6, 0)))
    # THEN nothing tells it to move the work to tensor cores it does not have
    assert p100.low_precision is NO_TENSOR_CORES
    assert diagnose(p100).get("tensor_cores_unused") is None


def test_an_unrecorded_device_gets_both_choices() -> None:
    a = _analysis(V100 / MANIFEST["fixtures"]["inference_v100"]["file"])
    unknown = dataclasses.replace(a, device=None, trace=dataclasses.replace(a.trace, accelerator=None))
    f = diagnose(unknown).get("tensor_cores_unused")
    assert f is not None and unknown.low_precision is UNKNOWN
    assert "torch.bfloat16" in f.fix.snippet and "torch.float16" in f.fix.snippet
    assert "GradScaler" in f.fix.snippet and "sm_80" in f.fix.snippet


def test_an_amd_trace_gets_bfloat16_without_tf32() -> None:
    a = _analysis(FIXTURES / "hta" / "amd_mi250.json.gz")
    assert a.low_precision is AMD and a.device_phrase.endswith("(gfx90a)")
