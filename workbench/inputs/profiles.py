"""Hardware profiles: how P, D and the baseline are placed and sized, and their defaults.

CPU: an unpinned vLLM CPU server spreads its OpenMP threads over every core, and two such
servers on a 2-core machine made a request about 9 times slower (the README, 'How a run is
measured'). So P and D get a core each; the baseline runs while P and D are idle (requests
are sequential), so it shares D's core instead of fighting for both.

GPU: the flags and environment of vLLM's PD + EAGLE3 acceptance test
(``tests/v1/kv_connector/nixl_integration/spec_decode_acceptance_test.sh``, the same in the
0.32.0 and 0.33.0 releases; transcribed with its source in
``data/vllm-test/spec_decode_acceptance_test.json``, which ``tests/pins/test_gpu_profile.py``
compares ``plan --profile gpu`` against): block size 16, ``--enforce-eager``,
``--max-model-len 16384`` (server and speculative config), ``--gpu-memory-utilization 0.7``,
``--attention-backend FLASH_ATTN`` (attention backends round differently, so the reference
figures hold only under it), ``--tensor-parallel-size 1``, ``VLLM_KV_CACHE_LAYOUT`` and
``UCX_NET_DEVICES=all``, P with 1 speculative token and D with 3, NIXL with
``kv_buffer_device`` ``cuda`` (vLLM's default on CUDA, left unset as the test does) or
``cpu``. ``gpu`` puts P and D on separate GPUs; ``gpu-single`` puts all three on one GPU,
which cannot give each 0.7 of its memory.

Models: the CPU profile's are local directories and its servers run with ``HF_HUB_OFFLINE``;
the GPU profiles name Hugging Face ids, which ``models.fetch`` downloads once before the
servers start, so their servers run online unless the user set ``HF_HUB_OFFLINE``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..knobs.spec import ENV_PIN_MAIN_THREAD

# The reference figures of vLLM's test on D (Llama-3.1-8B-Instruct + its EAGLE3 speculator,
# 80 MT-Bench prompts, 256 tokens, greedy, k=3), with its two-sided relative tolerance.
GPU_EXPECTED = {"acceptance_length": 2.60, "per_position": [0.7296, 0.5208, 0.3545],
                "rel_tolerance": 0.05}


@dataclass(frozen=True)
class Profile:
    name: str
    device: str
    block_size: int
    dtype: str
    kv_buffer_device: str = "cpu"
    enforce_eager: bool = True
    cpus: dict[str, str] = field(default_factory=dict)  # role -> VLLM_CPU_OMP_THREADS_BIND
    gpus: dict[str, str] = field(default_factory=dict)  # role -> CUDA_VISIBLE_DEVICES
    gpu_memory_utilization: dict[str, float] = field(default_factory=dict)
    default_target: str | None = None  # None: the CPU models shipped in data/models
    default_drafter: str | None = None
    default_prompt_set: str = "indomain"
    default_max_tokens: int = 64
    expected: dict | None = None
    # Sleep between NIXL progress-thread polls (workbench/knobs/nixl_progress.py). 0: NIXL's
    # busy polling, as vLLM runs it; on the 2-core CPU box that costs each idle P/D a core.
    nixl_progress_delay_us: int = 0
    max_model_len: int = 1024
    # vLLM's default token budget per scheduler step for an API server
    # (EngineArgs.get_batch_defaults): 2048 on the CPU and on GPUs under 70 GiB, 8192 above;
    # the smaller is assumed where the GPU is not known in advance.
    step_budget: int = 2048
    speculative_max_model_len: bool = False  # True: the drafter's config gets it as well
    server_args: tuple[str, ...] = ()  # more flags for every server of the profile
    server_env: dict[str, str] = field(default_factory=dict)  # more variables for every server
    hf_offline: bool = False  # True: servers get HF_HUB_OFFLINE=1 (local models only)
    # The knob ``runner`` a config of this profile starts from (``ExperimentConfig.for_profile``):
    # what vLLM itself runs there. GPU: Model Runner V2 (vLLM's default wherever Triton is);
    # CPU: the V1 runner (vLLM's fallback without triton-cpu; docs/runners.md says why the
    # workbench keeps it the CPU's default).
    runner: str = "v1"


# What every GPU profile shares: vLLM's test's models, prompts, lengths and server flags.
_GPU_TEST = dict(
    device="cuda", block_size=16, dtype="auto", kv_buffer_device="cuda",
    default_target="meta-llama/Llama-3.1-8B-Instruct",
    default_drafter="RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
    default_prompt_set="mt_bench", default_max_tokens=256, expected=GPU_EXPECTED,
    max_model_len=16384, speculative_max_model_len=True,
    server_args=("--tensor-parallel-size", "1", "--attention-backend", "FLASH_ATTN"),
    server_env={"VLLM_KV_CACHE_LAYOUT": "LBHNC", "UCX_NET_DEVICES": "all"}, runner="v2",
)

PROFILES: dict[str, Profile] = {
    "cpu": Profile("cpu", "cpu", block_size=32, dtype="float32",
                   cpus={"p": "0", "d": "1", "baseline": "1"}, nixl_progress_delay_us=1000,
                   # NIXL's CPU worker moves the forward thread to the last core (knobs/cpu_pin)
                   server_env={ENV_PIN_MAIN_THREAD: "1"}, hf_offline=True),
    # P and D on separate GPUs at the test's 0.7 each; the baseline shares D's GPU with what
    # is left (0.25: an 8B model's weights and enough KV for 32 requests on an 80 GB GPU) and
    # runs while PD is idle. Its KV cache size changes no greedy token.
    "gpu": Profile("gpu", gpus={"p": "0", "d": "1", "baseline": "1"},
                   gpu_memory_utilization={"p": 0.7, "d": 0.7, "baseline": 0.25}, **_GPU_TEST),
    # Everything on one GPU, its memory split three ways (the test's 0.7 each cannot fit).
    "gpu-single": Profile("gpu-single", gpus={"p": "0", "d": "0", "baseline": "0"},
                          gpu_memory_utilization={"p": 0.3, "d": 0.3, "baseline": 0.3},
                          **_GPU_TEST),
}


def check_expected(side: dict, expected: dict) -> dict:
    """Measured acceptance against a profile's reference figures, with its two-sided relative
    tolerance on the acceptance length and on every position (as vLLM's test checks them)."""
    tol = expected["rel_tolerance"]
    ref_len, ref_pos = expected["acceptance_length"], expected["per_position"]
    rel_len = (side["acceptance_length"] - ref_len) / ref_len
    rel_pos = [(m - r) / r for m, r in zip(side["per_position"], ref_pos, strict=False)]
    ok = (abs(rel_len) <= tol and len(side["per_position"]) == len(ref_pos)
          and all(abs(e) <= tol for e in rel_pos))
    return {"pass": ok, "rel_err_acceptance_length": rel_len, "rel_err_per_position": rel_pos}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile {name!r} is unknown; allowed: {', '.join(PROFILES)}") from None
