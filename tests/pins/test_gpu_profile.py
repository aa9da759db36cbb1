"""`plan --profile gpu` equals vLLM's PD + EAGLE3 acceptance test, flag for flag.

The test's flags and environment are written down, with their source (file, releases,
sha256), in ``data/vllm-test/spec_decode_acceptance_test.json``; ``make compat`` re-derives
them from the script in each release's sdist (``workbench/compat/test_script.py``); every flag
and variable the workbench adds is listed there with the reason. Both ``kv_buffer_device``
values: ``cuda`` (the default) and ``cpu`` (``--knob transfer=host-staged``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((ROOT / "data/vllm-test/spec_decode_acceptance_test.json").read_text())
PER_SERVER = "<per server>"
ENTRY = "vllm.entrypoints.openai.api_server"


def plan(*args: str) -> dict[str, dict]:
    out = subprocess.run([sys.executable, "-m", "workbench", "plan", *args],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return {s["role"]: s for s in map(json.loads, out.splitlines())}


def flags(argv: list[str]) -> dict[str, object]:
    """``--flag value`` pairs after the entry module (JSON values parsed; switches: None)."""
    args, out = argv[argv.index(ENTRY) + 1:], {}
    for i, tok in enumerate(args):
        if tok.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            value = None if nxt is None or nxt.startswith("--") else nxt
            if value is not None and value.startswith("{"):
                value = json.loads(value)
            out[tok] = value
    return out


def _same(got: dict, want: dict, added: set[str], what: str) -> None:
    for name, value in want.items():
        assert name in got, f"{what}: vLLM's test passes {name}, the plan does not"
        if value != PER_SERVER:
            assert got[name] == value, f"{what} {name}: plan {got[name]!r}, test {value!r}"
    extra = {n for n in set(got) - set(want)
             if n not in added and not n.startswith("WORKBENCH_")}
    assert not extra, f"{what}: the plan adds {sorted(extra)}, not listed as additions"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_gpu_plan_equals_vllms_test_flags_and_env(device):
    knobs = ["--knob", "transfer=host-staged"] if device == "cpu" else []
    servers = plan("--profile", "gpu", *knobs)
    add = REF["workbench_additions"]
    for role in ("p", "d"):
        want, s = REF["servers"][device][role], servers[role]
        got = flags(s["argv"])
        assert got["--model"] == want["model"]
        _same(got, want["flags"], set(add["flags"]), f"{device}/{role} flags")
        _same(s["env"], want["env"], set(add["env"]), f"{device}/{role} env")
        assert s["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == REF["server_host"]
        assert "HF_HUB_OFFLINE" not in s["env"]  # Hub ids: downloaded before servers start
    assert servers["p"]["env"]["CUDA_VISIBLE_DEVICES"] != servers["d"]["env"][
        "CUDA_VISIBLE_DEVICES"]  # the test gives P and D a GPU each


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_gpu_baseline_is_d_without_the_connector(device):
    knobs = ["--knob", "transfer=host-staged"] if device == "cpu" else []
    servers = plan("--profile", "gpu", *knobs)
    d, base = flags(servers["d"]["argv"]), flags(servers["baseline"]["argv"])
    for name in ("--kv-transfer-config", "--port", "--gpu-memory-utilization"):
        d.pop(name)
    assert base.pop("--gpu-memory-utilization") == "0.25"
    base.pop("--port")
    assert base == d
    nixl = {k for k in servers["d"]["env"] if k.startswith("VLLM_NIXL_")}
    assert set(servers["baseline"]["env"]) | nixl == set(servers["d"]["env"])


def test_gpu_single_differs_from_the_test_only_in_placement():
    """One GPU cannot give three servers 0.7 of its memory each; everything else is equal."""
    gpu, single = plan("--profile", "gpu"), plan("--profile", "gpu-single")
    for role in ("p", "d", "baseline"):
        a, b = flags(gpu[role]["argv"]), flags(single[role]["argv"])
        for f in (a, b):
            f.pop("--port")
        assert b.pop("--gpu-memory-utilization") == "0.3"
        a.pop("--gpu-memory-utilization")
        assert a == b
        assert single[role]["env"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_cpu_profile_stays_offline_and_gpu_follows_the_user(monkeypatch):
    """HF_HUB_OFFLINE: the CPU profile's local models set it; a GPU server inherits the
    user's own setting through the environment it starts with (servers.VllmServer.start)."""
    cpu = plan("--profile", "cpu")
    assert all(s["env"]["HF_HUB_OFFLINE"] == "1" for s in cpu.values())
    gpu = plan("--profile", "gpu")
    assert not any("HF_HUB_OFFLINE" in s["env"] for s in gpu.values())


def test_the_reference_is_vllms_script_as_make_compat_reads_it():
    """``make compat`` writes the reference's servers from the script in each release's
    sdist (``compat/test_script.py``); read again here from the sdists it cached (skipped
    where it has not run), they are the committed ones, and so is the script's sha256."""
    from workbench.compat import CACHE, test_script

    releases = REF["source"]["releases"]
    if not all((CACHE / f"vllm-{v}.tar.gz").is_file() for v in releases):
        pytest.skip(f"the sdists of vLLM {', '.join(releases)} are not in {CACHE}: "
                    "`make compat` downloads them")
    again = test_script.reference(releases, CACHE, REF)
    assert again["servers"] == REF["servers"]
    assert again["server_host"] == REF["server_host"]
    assert again["source"]["sha256"] == REF["source"]["sha256"]
    assert again["source"]["lines"] == REF["source"]["lines"]


# The shapes vLLM's script is written in, in a few lines: defaults, a platform picked by an
# `if` on a command's output, arrays, a function called per kv_buffer_device, a loop over
# instances whose ports are per server.
MINI_SCRIPT = r"""
MODEL="${MODEL:-m/target}"
BS=${BS:-16}
SERVER_HOST="${SERVER_HOST:-127.0.0.1}"
CONF="{\"method\":\"eagle3\",\"model\":\"m/d\",\"max_model_len\":${BS}}"
if [[ -n "$MEM_BYTES" ]]; then
  MEM=(--kv-cache-memory-bytes "$MEM_BYTES")
else
  MEM=(--gpu-memory-utilization 0.7)
fi
SMI_BIN=$(which nvidia-smi || which rocm-smi || echo "")
if [[ "$SMI_BIN" == *"rocm"* ]]; then
  DEV_VAR="HIP_VISIBLE_DEVICES"
else
  DEV_VAR="CUDA_VISIBLE_DEVICES"
fi
EXTRA=()
start() {
  local dev=$1
  kv_d="{\"kv_connector\":\"Nixl\",\"kv_role\":\"kv_consumer\",\"kv_buffer_device\":\"${dev}\"}"
  for i in $(seq 0 $((1-1))); do
    local PORT=$((8100 + i))
    env ${DEV_VAR}="$i" SIDE="$SERVER_HOST" vllm serve "$MODEL" --port $PORT \
      --block-size "${BS}" "${MEM[@]}" --enforce-eager \
      --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}' \
      --speculative-config "$CONF" ${EXTRA[@]+"${EXTRA[@]}"} &
    env ${DEV_VAR}="$i" vllm serve "$MODEL" --port $((8200 + i)) "${MEM[@]}" \
      --kv-transfer-config "$kv_d" &
  done
}
for device in cuda cpu; do
  start "$device"
done
"""


def test_the_script_reader_reads_what_bash_would_run():
    from workbench.compat import test_script

    got = test_script.derive(MINI_SCRIPT)
    assert got["server_host"] == "127.0.0.1"
    assert set(got["servers"]) == {"cuda", "cpu"}
    p, d = got["servers"]["cpu"]["p"], got["servers"]["cpu"]["d"]
    assert p["model"] == d["model"] == "m/target"
    assert p["env"] == {"CUDA_VISIBLE_DEVICES": PER_SERVER, "SIDE": "127.0.0.1"}
    assert p["flags"] == {
        "--port": PER_SERVER, "--block-size": "16", "--gpu-memory-utilization": "0.7",
        "--enforce-eager": None,
        "--kv-transfer-config": {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
        "--speculative-config": {"method": "eagle3", "model": "m/d", "max_model_len": 16}}
    assert d["flags"]["--kv-transfer-config"]["kv_buffer_device"] == "cpu"
    assert got["servers"]["cuda"]["d"]["flags"]["--kv-transfer-config"][
        "kv_buffer_device"] == "cuda"
    # a default changed in the script is a changed reference
    bigger = test_script.derive(MINI_SCRIPT.replace("${BS:-16}", "${BS:-32}"))
    assert bigger["servers"]["cpu"]["p"]["flags"]["--block-size"] == "32"


def test_the_script_reader_refuses_to_guess():
    """A server start that depends on what the reader cannot decide fails the derivation."""
    from workbench.compat import test_script

    unknown = MINI_SCRIPT.replace('SMI_BIN=$(which nvidia-smi || which rocm-smi || echo "")',
                                  "SMI_BIN=$(detect-gpus)")
    with pytest.raises(test_script.ScriptError, match="CUDA_VISIBLE|DEV_VAR|does not know"):
        test_script.derive(unknown)
    gated = MINI_SCRIPT.replace("for device in cuda cpu; do",
                                'if [[ "$(hostname)" == gpu* ]]; then\nfor device in cuda cpu; do'
                                ).rstrip() + "\nfi\n"
    with pytest.raises(test_script.ScriptError, match="cannot decide"):
        test_script.derive(gated)
