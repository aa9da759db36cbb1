"""The backend's driver: always active, the CPU as the device (vLLM only asks whether one is).
A compiled launch (no ``TRITON_INTERPRET=1``) asks it for a device and a stream first, and is
told what is missing."""

from __future__ import annotations

from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

from .compiler import NEEDS_INTERPRETER


class InterpreterDriver(DriverBase):
    @classmethod
    def is_active(cls) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("Triton's interpreter passes Python values, not C++ ones")

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cpu", 0, 0)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self):
        from triton.testing import do_bench

        return do_bench

    def get_current_device(self) -> int:
        raise RuntimeError(NEEDS_INTERPRETER)

    def get_current_stream(self, device: int | None = None) -> int:
        raise RuntimeError(NEEDS_INTERPRETER)
