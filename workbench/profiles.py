"""Hardware profiles: how P, D and the baseline are placed and sized.

CPU: each idle-but-running vLLM CPU server spreads its OpenMP threads over every core by
default, and two unpinned servers on a 2-core machine made a request about 9 times slower
(notes, section 8). So P and D get a core each; the baseline runs while P and D are idle
(runs are sequential), so it shares a core instead of fighting for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Profile:
    name: str
    device: str
    cpus: dict[str, str | None] = field(default_factory=dict)  # role -> VLLM_CPU_OMP_THREADS_BIND
    kv_buffer_device: str = "cpu"
    dtype: str = "float32"
    enforce_eager: bool = True


PROFILES: dict[str, Profile] = {
    "cpu": Profile("cpu", "cpu", cpus={"p": "0", "d": "1", "baseline": "1"}),
    "gpu": Profile("gpu", "cuda", cpus={}, kv_buffer_device="cuda", dtype="bfloat16"),
}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile {name!r} is unknown; allowed: {', '.join(PROFILES)}") from None
