"""What the GPU is: name, SMs, memory, limits. Built from a trace's `deviceProperties` or from torch."""

from gpudoctor.device.info import DeviceInfo

__all__ = ["DeviceInfo"]
