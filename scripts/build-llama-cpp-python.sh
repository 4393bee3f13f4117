#!/usr/bin/env bash
# Build and install the pinned llama-cpp-python from its source distribution, with specdec's
# native kernels (native/rowwise/, copied into ggml's CPU backend as ggml-cpu/specdec/;
# native/cuda/, into its CUDA backend as ggml-cuda/specdec/) and
# llama.cpp patches (patches/llama.cpp/*.patch, applied in name order to vendor/llama.cpp).
# Usage: scripts/build-llama-cpp-python.sh PYTHON VERSION
# CMAKE_ARGS comes from specdec_cli/build_flags.py (CMAKE_ARGS replaces the computed flags,
# SPECDEC_CMAKE_ARGS adds to them).
set -euo pipefail
python=$1
version=$2
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command -v patch >/dev/null || { echo "error: 'patch' is needed (apt-get install patch)" >&2; exit 1; }

"$python" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$work"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
source_dir="$work/llama_cpp_python-$version"
mkdir -p "$source_dir/vendor/llama.cpp/ggml/src/ggml-cpu/specdec"
cp "$root"/native/rowwise/rowwise.h "$root"/native/rowwise/rowwise_x86.c "$root"/native/rowwise/rowwise_ggml.c \
    "$root"/native/rowwise/attention.h "$root"/native/rowwise/attention.c \
    "$source_dir/vendor/llama.cpp/ggml/src/ggml-cpu/specdec/"
mkdir -p "$source_dir/vendor/llama.cpp/ggml/src/ggml-cuda/specdec"
cp "$root"/native/cuda/mmv_tc.cu "$root"/native/cuda/mmv_tc.cuh "$root"/native/cuda/fattn_rows.cu \
    "$root"/native/cuda/fattn_rows.cuh "$root"/native/cuda/kernel_common.cuh \
    "$source_dir/vendor/llama.cpp/ggml/src/ggml-cuda/specdec/"
for patch_file in "$root"/patches/llama.cpp/*.patch; do
    echo "applying $(basename "$patch_file")"
    patch -p1 --forward --batch --quiet -d "$source_dir/vendor/llama.cpp" <"$patch_file"
done

CMAKE_ARGS="$("$python" "$root/specdec_cli/build_flags.py")" FORCE_CMAKE=1 \
    "$python" -m pip install --force-reinstall --no-deps --no-cache-dir "$source_dir"
# its own dependencies (numpy, jinja2, ...), without touching the build above
"$python" -m pip install --quiet "llama-cpp-python==$version"
