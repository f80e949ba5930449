#!/usr/bin/env bash
# Builds llama.cpp's llama-quantize, llama-bench and llama-server from the llama.cpp inside
# the llama-cpp-python source package on PyPI (the same code as the peer
# that bench/e2e/cpu_vs_llamacpp.py loads), into build/llamacpp/.
#
# The CPU flags are explicit (GGML_NATIVE=OFF): the Xeon hosts this runs on
# advertise AMX in CPUID, and a -march=native build dies with SIGILL in
# ggml's AMX matmul there; AMX stays off, the AVX-512 family the host
# reports (lscpu) is on. Idempotent: rebuilds only what changed.
#   bench/build_llamacpp_tools.sh               # prints the bin directory
#   bench/build_llamacpp_tools.sh --cmake-flags # prints the GGML CPU flags only
#     (run_cpu_bench.sh passes them as CMAKE_ARGS to llama-cpp-python's build)
#   bench/build_llamacpp_tools.sh --cuda        # llama-bench and llama-batched-bench
#     with ggml's CUDA backend, into build/llamacpp/build-cuda (prints its bin
#     directory). SASS for CUDA_ARCHS only (default 90-real: the H200; no PTX,
#     so the binary stays small enough to ship to the device), the CPU flags as
#     above, static ggml/llama, CUDA graphs on (llama.cpp's default), NCCL off
#     (one GPU), FlashAttention kernels for f16 KV only (GGML_CUDA_FA_ALL_QUANTS
#     off, llama.cpp's default). The CUDA objects compile slowly (~190 .cu
#     files): ccache holds them between runs.
#     LLAMACPP_CUDA_MINIMAL=1: only the template instances the GGUF benchmark
#     reaches (bench/cuda/gguf_vs_llamacpp.sh: Llama-3.1-8B in Q4_K_M / Q8_0,
#     head size 128, GQA 4, f16 KV, flash attention on): the ggml-cuda
#     CMakeLists.txt of the unpacked package gets a source filter, and the
#     tools link against generated stubs for the left-out instances (named
#     from the first link's undefined references), each of which aborts with
#     its name if reached (no other code changes; linking with unresolved
#     symbols allowed instead gives binaries the loader rejects: "unexpected
#     PLT reloc type 0x00"). About 60 of ~120 instance files
#     are left out (mmq of other types, mmf, FA for other head sizes / GQA
#     groupings / quantized KV): hours less on a 2-core builder.
set -euo pipefail
cd "$(dirname "$0")/.."
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
avx512=OFF
[ "$(has avx512f)" = ON ] && [ "$(has avx512bw)" = ON ] && [ "$(has avx512vl)" = ON ] && avx512=ON
sub512() { [ $avx512 = ON ] && has "$1" || echo OFF; }
cpu_flags=(-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF
  -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)"
  -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$avx512"
  -DGGML_AVX512_VNNI="$(sub512 avx512_vnni)" -DGGML_AVX512_VBMI="$(sub512 avx512vbmi)"
  -DGGML_AVX512_BF16="$(sub512 avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
if [ "${1:-}" = --cmake-flags ]; then
  echo "${cpu_flags[*]}"
  exit 0
fi
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=build/llamacpp
SRC=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
mkdir -p "$DIR"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$DIR" "llama-cpp-python==$VERSION" >&2
  tar xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ "${1:-}" = --cuda ]; then
  command -v ccache >/dev/null && launcher+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  minimal=(-DGGML_CUDA_INSTANCE_EXCLUDE= -DCMAKE_EXE_LINKER_FLAGS=)
  if [ "${LLAMACPP_CUDA_MINIMAL:-0}" = 1 ]; then
    cuda_cmake=$SRC/ggml/src/ggml-cuda/CMakeLists.txt
    if ! grep -q GGML_CUDA_INSTANCE_EXCLUDE "$cuda_cmake"; then
      sed -i 's|^    ggml_add_backend_library(ggml-cuda$|    if (GGML_CUDA_INSTANCE_EXCLUDE)\n        list(FILTER GGML_SOURCES_CUDA EXCLUDE REGEX "${GGML_CUDA_INSTANCE_EXCLUDE}")\n    endif()\n&|' "$cuda_cmake"
      grep -q GGML_CUDA_INSTANCE_EXCLUDE "$cuda_cmake" || { echo "could not patch $cuda_cmake" >&2; exit 1; }
    fi
    ti='template-instances/'
    minimal=(-DGGML_CUDA_INSTANCE_EXCLUDE="${ti}(mmq-instance-(iq|mxfp4|nvfp4|q1_0|q2_0|q2_k|q3_k|q4_0|q4_1|q5_0|q5_1|q5_k)|mmf-instance|fattn-mma-f16-instance-ncols1_[0-9]+-ncols2_(8|16|32)|fattn-vec-instance-(q4_0|q8_0|bf16)|fattn-tile-instance-dkq(40|64|72|80|96|112|192|256|320|512|576)-)"
             -DCMAKE_EXE_LINKER_FLAGS=-Wl,--no-demangle)
  fi
  cmake -S "$SRC" -B "$DIR/build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
    "${cpu_flags[@]}" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90-real}" \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "${minimal[@]}" >&2
  if [ "${LLAMACPP_CUDA_MINIMAL:-0}" = 1 ]; then
    # First link: the undefined references are the left-out instances.
    cmake --build "$DIR/build-cuda" -j "${JOBS:-2}" --target ${TARGETS:-llama-bench llama-batched-bench} \
      > "$DIR/cuda-link.log" 2>&1 || true
    grep -o "undefined reference to \`[A-Za-z0-9_]*'" "$DIR/cuda-link.log" | sed "s/.*\`//; s/'$//" | sort -u \
      > "$DIR/cuda-missing.txt" || true
    {
      echo '#include <stdio.h>'
      echo '#include <stdlib.h>'
      echo 'static void left_out(const char* s) { fprintf(stderr, "llama.cpp kernel not built (LLAMACPP_CUDA_MINIMAL): %s\n", s); abort(); }'
      while read -r sym; do echo "void $sym(void) { left_out(\"$sym\"); }"; done < "$DIR/cuda-missing.txt"
    } > "$DIR/cuda_stubs.c"
    cc -O1 -c "$DIR/cuda_stubs.c" -o "$DIR/cuda_stubs.o"
    echo "$(wc -l < "$DIR/cuda-missing.txt") left-out symbols stubbed ($DIR/cuda_stubs.c)" >&2
    cmake -S "$SRC" -B "$DIR/build-cuda" -DCMAKE_EXE_LINKER_FLAGS="$PWD/$DIR/cuda_stubs.o" >&2
  fi
  cmake --build "$DIR/build-cuda" -j "${JOBS:-2}" --target ${TARGETS:-llama-bench llama-batched-bench} >&2
  echo "$DIR/build-cuda/bin"
  exit 0
fi
cmake -S "$SRC" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  "${cpu_flags[@]}" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
# TARGETS="llama ggml": the libraries alone (tools/make_family_gguf.py links its own tool).
# llama-server is the served peer of bench/e2e/serve_vs_llamaserver.py (its web UI is
# not built: no assets are fetched, the API is all the benchmark needs).
cmake --build "$DIR/build" -j "${JOBS:-2}" --target ${TARGETS:-llama-quantize llama-bench llama-server} >&2
echo "$DIR/build/bin"
