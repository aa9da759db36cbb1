#!/usr/bin/env bash
# GPU runbook: on a machine with two GPUs, install the `gpu` extra, check the installed vLLM
# release against its own source, run the reference experiment in vLLM's test shape (80
# MT-Bench prompts, 256 tokens, one request at a time, kv_buffer_device cuda and cpu) and
# the default knob grid and the KV connectors a CPU cannot run, then print pass/fail against
# vLLM's reference (2.60 and 0.7296 / 0.5208 / 0.3545 on D, +-5% per position).
#
#   scripts/gpu-check.sh            # run it (about 16 GB of weights download once)
#   scripts/gpu-check.sh --dry-run  # print every command and environment, run nothing
#
# Environment: VENV (default .venv-gpu), OUT (default runs/gpu-check), PROMPTS (80),
# MAX_TOKENS (256), VLLM_SPEC (pip requirement for vllm, default: the extra's range),
# PYTHON (the interpreter that creates the venv; in --dry-run it prints the servers' plan).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${VENV:-$ROOT/.venv-gpu}"
OUT="${OUT:-$ROOT/runs/gpu-check}"
PROMPTS="${PROMPTS:-80}"
MAX_TOKENS="${MAX_TOKENS:-256}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"
DRY_RUN=0

for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (use --dry-run or --help)" >&2; exit 2 ;;
  esac
done

# Print a command as the shell would run it; run it unless --dry-run.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ "$DRY_RUN" == 0 ]]; then "$@"; fi
}

echo "== environment"
echo "ROOT=$ROOT"
echo "VENV=$VENV"
echo "OUT=$OUT"
echo "PROMPTS=$PROMPTS MAX_TOKENS=$MAX_TOKENS"
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<unset: P on GPU 0, D and the baseline on GPU 1>}"
echo "HF_HOME=${HF_HOME:-<unset: ~/.cache/huggingface>}"
echo "HF_TOKEN=$([[ -n "${HF_TOKEN:-}" ]] && echo '<set>' || echo '<unset: meta-llama needs one, or a prior huggingface-cli login>')"
echo "HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-<unset: models download once before the servers start>}"

echo "== GPUs (two needed)"
if [[ "$DRY_RUN" == 0 ]]; then
  n="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
  if (( n < 2 )); then echo "FAIL: $n GPU(s); profile gpu needs two" >&2; exit 1; fi
else
  echo "+ nvidia-smi --query-gpu=name --format=csv,noheader | wc -l   # must be >= 2"
fi

echo "== install the gpu extra"
run "$PYTHON" -m venv "$VENV"
run "$PY" -m pip install --upgrade pip
run "$PY" -m pip install -e "$ROOT[gpu,notebooks]" ${VLLM_SPEC:+"$VLLM_SPEC"}

echo "== the installed vLLM against its own source, and the servers' plan"
run "$PY" -m workbench compat --installed
for device in cuda cpu; do
  knobs=()
  [[ "$device" == cpu ]] && knobs=(--knob transfer=host-staged)
  echo "# kv_buffer_device=$device: every server's command line and environment"
  if [[ "$DRY_RUN" == 1 ]]; then
    (cd "$ROOT" && "$PYTHON" -m workbench plan --profile gpu "${knobs[@]}") \
      || echo "# (plan needs the workbench importable by $PYTHON)"
  else
    run "$PY" -m workbench plan --profile gpu "${knobs[@]}"
  fi
done

echo "== reference experiment in vLLM's test shape, both buffer devices"
for device in cuda cpu; do
  knobs=()
  [[ "$device" == cpu ]] && knobs=(--knob transfer=host-staged)
  run "$PY" -m workbench run --profile gpu --prompt-set mt_bench --prompts "$PROMPTS" \
    --max-tokens "$MAX_TOKENS" --concurrency 1 "${knobs[@]}" --out "$OUT/reference-$device"
done

echo "== default knob grid"
run "$PY" -m workbench sweep --grid default --profile gpu --out "$OUT/sweep"

echo "== KV connectors the CPU cannot run (docs/connectors.md): their plan; offloading run"
# OffloadingConnector under MultiConnector with NIXL pull runs on 16 prompts. LMCacheConnectorV1:
# plan only. Its PD mode also needs the lmcache package and an LMCACHE_CONFIG_FILE per role
# (enable_pd, the peer's address), LMCache's configuration, which the workbench does not write.
for conn in offloading lmcache; do
  echo "# connector=$conn: every server's command line and environment"
  if [[ "$DRY_RUN" == 1 ]]; then
    (cd "$ROOT" && "$PYTHON" -m workbench plan --profile gpu --knob "connector=$conn") \
      || echo "# (plan needs the workbench importable by $PYTHON)"
  else
    run "$PY" -m workbench plan --profile gpu --knob "connector=$conn"
  fi
done
run "$PY" -m workbench run --profile gpu --knob connector=offloading --prompts 16 --kv-probe \
  --out "$OUT/connector-offloading"

echo "== pass/fail against vLLM's reference (+-5% per position)"
run "$PY" -m workbench.measuring.gpu_check "$OUT/reference-cuda" "$OUT/reference-cpu"
