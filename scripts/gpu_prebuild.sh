#!/usr/bin/env bash
# Build the GPU run's llama.cpp libraries here, without a GPU, so that scripts/gpu_device.sh
# skips its own build on the GPU machine (about 280 of a session's 900 device seconds).
# Needs CUDA's compiler (nvcc, no driver or GPU). cuBLAS comes from PyPI's nvidia-cublas wheel of
# nvcc's release; where the toolkit has no driver stub, one of ours stands in for libcuda.so.1 at
# link time (the GPU machine's driver is the one loaded). The libraries are built from the kit's
# source (.gpu/src.tar.gz, made by its pack.sh) with native/cuda's kernels and native/rowwise's attention
# copied in, as gpu_device.sh
# builds them, for AVX2 CPUs without AVX-512 whatever this CPU has: the GPU machine's may lack it.
# Fails where a library exports libstdc++'s code (the load crash of issue 40).
# Usage, from the project root after pack.sh and `make install` (its .venv loads the libraries
# once built; PYTHON names another): scripts/gpu_prebuild.sh [DIR]   (default .gpu)
# Writes DIR/lib.tar.xz. The build stays in SPECDEC_GPU_BUILD (~/.cache/specdec/gpu-build): a
# run after a change rebuilds what the change touched. The first build took 30 min on 2 Xeon cores.
set -euo pipefail
dir=${1:-.gpu}
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda/bin/nvcc
cache=${SPECDEC_GPU_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec/gpu-build}
[ -x "$nvcc" ] || { echo "error: no nvcc at $nvcc: install CUDA's toolkit or set CUDA_HOME" >&2; exit 1; }
[ -f "$dir/src.tar.gz" ] || { echo "error: no $dir/src.tar.gz: run the GPU kit's pack.sh first" >&2; exit 1; }
release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache"

cublas=$cache/cublas-$release
if [ ! -f "$cublas/done" ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cublas==$release.*" -d "$work/whl"
    unzip -q "$work"/whl/*.whl 'nvidia/*' -d "$work/cublas"
    mkdir -p "$cublas" && cp -r "$work"/cublas/nvidia/*/include "$work"/cublas/nvidia/*/lib "$cublas/"
    touch "$cublas/done"
fi
driver=$(find "$cuda/lib64/stubs" "$cuda/lib/stubs" -name libcuda.so 2>/dev/null | head -1 || true)
if [ -z "$driver" ]; then
    # Every function cuda.h declares, under the names its macros give them: a stub that defined
    # none would be dropped from the link (--as-needed), and the driver never loaded on the GPU.
    driver=$cache/stub/libcuda.so
    mkdir -p "$cache/stub"
    echo '#include <cuda.h>' | gcc -E -I"$cuda/include" - | grep -oE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' \
        | sed 's/\s*($//' | sort -u | awk '{print "int " $1 "(void) { return 999; }"}' >"$work/stub.c"
    if ! cmp -s "$work/stub.c" "$cache/stub/stub.c" || [ ! -f "$driver" ]; then  # else no relink
        cp "$work/stub.c" "$cache/stub/stub.c"
        gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$driver" "$cache/stub/stub.c"
    fi
fi

# The source, copied file by file only where it changed, so that an unchanged file keeps its
# time and the build stays incremental.
tar -xzf "$dir/src.tar.gz" -C "$work"
fresh=$(echo "$work"/llama_cpp_python-*)
mkdir -p "$fresh/vendor/llama.cpp/ggml/src/ggml-cuda/specdec"
cp native/cuda/mmv_tc.cu native/cuda/mmv_tc.cuh native/cuda/fattn_rows.cu native/cuda/fattn_rows.cuh native/cuda/kernel_common.cuh \
    "$fresh/vendor/llama.cpp/ggml/src/ggml-cuda/specdec/"
# the kit packs native/rowwise's first three files; patch 0002 compiles its attention kernel too
cp native/rowwise/attention.c native/rowwise/attention.h native/rowwise/rowwise_ggml.c \
    "$fresh/vendor/llama.cpp/ggml/src/ggml-cpu/specdec/"
python3 - "$fresh" "$cache/src" <<'EOF'
import filecmp, shutil, sys
from pathlib import Path
fresh, kept = Path(sys.argv[1]), Path(sys.argv[2])
for path in fresh.rglob("*"):
    target = kept / path.relative_to(fresh)
    if path.is_file() and not (target.is_file() and filecmp.cmp(path, target, shallow=False)):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
EOF

cpu="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF"
export SPECDEC_CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} $cpu"
# shellcheck disable=SC2046  # build_flags.py prints one flag per word
cmake -S "$cache/src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSKBUILD_PLATLIB_DIR="$cache/plat" -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_FLAGS="-I$cublas/include" -DCUDA_cuda_driver_LIBRARY="$driver" \
    -DCUDA_cublas_LIBRARY="$(echo "$cublas"/lib/libcublas.so.*)" \
    -DCUDA_cublasLt_LIBRARY="$(echo "$cublas"/lib/libcublasLt.so.*)" \
    $(python3 specdec_cli/build_flags.py) >"$cache/configure.log"
cmake --build "$cache/build" -j "$(nproc)"
cmake --install "$cache/build" >/dev/null
lib=$(dirname "$(find "$cache/plat" -name 'libllama.so*' | head -1)")
for library in "$lib"/lib*.so; do
    exported=$(nm -D --defined-only "$library" | c++filt | grep -c ' T std::' || true)
    [ "$exported" = 0 ] || { echo "error: $(basename "$library") exports libstdc++ code ($exported functions)" >&2; exit 1; }
done
readelf -d "$lib/libggml-cuda.so" | grep -q 'NEEDED.*libcuda\.so\.1' \
    || { echo "error: libggml-cuda.so does not load CUDA's driver (libcuda.so.1)" >&2; exit 1; }
# Loaded and a tiny model decoded in exact mode on this CPU through them (the driver stub finds
# no GPU): a library that crashes at load, as in issue 40, fails here and not in device time.
mkdir -p "$work/driver" && ln -sf "$driver" "$work/driver/libcuda.so.1"
LD_LIBRARY_PATH="$lib:$cuda/lib64:$cublas/lib:$work/driver" LLAMA_CPP_LIB_PATH="$lib" \
    "${PYTHON:-.venv/bin/python}" - <<'EOF'
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts")
import check_build
with tempfile.TemporaryDirectory() as folder:
    check_build.check(check_build.tiny_model(Path(folder)), gpu=False)
print("the libraries load here and decode a tiny model on the CPU, batch-invariant")
EOF
# Their RUNPATH names this machine's cuBLAS and stub folders too (llama-cpp-python's CMake adds
# link folders): absent on the GPU machine, and searched after LD_LIBRARY_PATH anyway.
tar -C "$lib/.." -cf - lib | xz -T0 -6 >"$dir/lib.tar.xz"
echo "$dir/lib.tar.xz: $(du -h "$dir/lib.tar.xz" | cut -f1); $dir in all: $(du -sh "$dir" | cut -f1) (at most 64 MiB travel)"
