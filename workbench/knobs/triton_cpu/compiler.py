"""The backend's compiler: it compiles nothing, since Triton's interpreter runs every kernel."""

from __future__ import annotations

from triton.backends.compiler import BaseBackend, GPUTarget


class InterpreterOnlyBackend(BaseBackend):
    """Accepts the ``cpu`` target; any attempt to compile says the interpreter is needed."""

    @staticmethod
    def supports_target(target: GPUTarget) -> bool:
        return target.backend == "cpu"

    def hash(self) -> str:
        return "workbench-triton-cpu-interpreter"

    def parse_options(self, options: dict) -> object:
        raise RuntimeError(NEEDS_INTERPRETER)

    def add_stages(self, stages: dict, options: object, language) -> None:
        raise RuntimeError(NEEDS_INTERPRETER)

    def load_dialects(self, context) -> None:
        return None

    def get_module_map(self) -> dict:
        return {}


NEEDS_INTERPRETER = (
    "workbench's Triton 'cpu' backend compiles nothing: set TRITON_INTERPRET=1 so Triton's "
    "interpreter runs the kernel (workbench.knobs.triton_cpu.server_env)")
