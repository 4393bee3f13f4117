#!/usr/bin/env bash
# The GPU run rehearsed here, without a GPU: scripts/gpu_device.sh from start to verdict, on the
# libraries scripts/gpu_prebuild.sh built (their CUDA backend finds no device through the stub
# driver, so every model decodes on this CPU) and on small random-weight models named as the
# shapes, so that a mistake in the script shows here and not in a session's 15 minutes of GPU.
# The kernels' own tests need a GPU and are left out (KERNEL_TESTS=0: their lines are the
# verdict's only "missing" ones), and the speed targets are the CPU's: what a rehearsal shows is
# that every other step runs and leaves what the verdict reads.
# Usage, from the project root after pack.sh, `make install` and gpu_prebuild.sh:
#   scripts/gpu_rehearsal.sh [LOGDIR]   (default: a temporary folder)
set -euo pipefail
log=${1:-$(mktemp -d)}
cuda=${CUDA_HOME:-/usr/local/cuda}
cache=${SPECDEC_GPU_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec/gpu-build}
[ -f .gpu/lib.tar.xz ] || { echo "error: no .gpu/lib.tar.xz: run scripts/gpu_prebuild.sh first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/driver" "$work/models" "$work/tmp"
driver=$(find "$cuda/lib64/stubs" "$cuda/lib/stubs" "$cache/stub" -name libcuda.so 2>/dev/null | head -1 || true)
ln -s "$driver" "$work/driver/libcuda.so.1"
cublas=$(dirname "$(find "$cache" -path '*cublas-*/lib/libcublas.so.*' | head -1)")
# The smallest shape the kit writes (the Qwen vocabulary, 2 layers), under every shape's name.
vendor=$cache/src/vendor/llama.cpp
PYTHONPATH=$vendor/gguf-py .venv/bin/python .gpu/make_shape_gguf.py \
    "$vendor/models/ggml-vocab-qwen2.gguf" "$work/models" tiny
for shape in qwen2.5-7b qwen2.5-1.5b qwen2.5-0.5b; do
    ln -s "$work/models/tiny.gguf" "$work/models/$shape.gguf"
done
# The benches take greedy choices on the device, as on a GPU where they pay (on this CPU they
# do not: choice_costs.py would keep them on the host).
PATH=$PWD/.venv/bin:$cuda/bin:$PATH TMPDIR=$work/tmp MODELS=$work/models REPEATS=1 KERNEL_TESTS=0 \
    DEVICE_CHOICES=${DEVICE_CHOICES:-1} \
    LD_LIBRARY_PATH="$cuda/lib64:$cublas:$work/driver" \
    bash scripts/gpu_device.sh "$log" || true
echo "logs: $log"
# ONLY_FATTN=1 (rehearsing a second call) runs no benches
not_run="tensor-core kernel"
[ "${ONLY_FATTN:-0}" != 1 ] || not_run="$not_run\|: oracle"
if grep '^missing' "$log/run.log" | grep -v "$not_run"; then
    echo "error: the rehearsal left targets missing: a step of gpu_device.sh did not run" >&2
    exit 1
fi
grep -q 'exact+fattn_rows' "$log/check.json" \
    || { echo "error: the rehearsal did not reach the attention kernel's step" >&2; exit 1; }
[ "${ONLY_FATTN:-0}" = 1 ] && exit 0  # the rest is the first call's alone
grep -q ':choices' "$log/check.json" \
    || { echo "error: the rehearsal did not reach the step of greedy choices on the device" >&2; exit 1; }
grep -q "^benches' greedy choices: SPECDEC_DEVICE_CHOICES=${DEVICE_CHOICES:-1} " "$log/run.log" \
    || { echo "error: the benches did not take the greedy choices the rehearsal set" >&2; exit 1; }
