"""The versions and flags that change what a step costs, read from the running process."""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

from gpudoctor.runner.record import Environment


def cuda_uuid() -> str:
    import torch

    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def environment(cuda: bool) -> Environment:
    """The versions and flags that change what a step costs, read now."""
    import platform

    import torch

    env = Environment(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
        cpu_count=os.cpu_count(),
    )
    if cuda:
        index = torch.cuda.current_device()
        env = replace(env, device=f"cuda:{index}", gpu_name=torch.cuda.get_device_name(index))
        with contextlib.suppress(Exception):
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
                env = replace(env, driver=driver.decode() if isinstance(driver, bytes) else driver)
            finally:
                pynvml.nvmlShutdown()
    return env
