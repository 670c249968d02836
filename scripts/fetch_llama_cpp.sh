#!/usr/bin/env bash
# Builds llama.cpp, the reference implementation moebatch is checked and benchmarked against, from
# the llama-cpp-python source distribution on PyPI (version and sha256 pinned below; its
# vendor/llama.cpp is ggml-org/llama.cpp@0c1e57098, which has MXFP4 / gpt-oss), into
# .deps/llama.cpp/:
#   bin/   llama-perplexity llama-batched-bench llama-bench llama-quantize llama-simple
#          llama-completion test-backend-ops   (RPATH $ORIGIN/../lib: they run from anywhere)
#   lib/   libllama.so libggml.so libggml-base.so libggml-cpu.so
#   src/   the unpacked sdist; llama.cpp/ is a link to its vendor/llama.cpp, which holds
#          convert_hf_to_gguf.py (+ conversion/) and gguf-py/ (the script puts gguf-py on
#          sys.path itself; it needs torch + transformers: run it with .venv-fixtures/bin/python)
#   build/ the CMake build tree (CPU only, Release, GGML_NATIVE=ON but no AMX (see below),
#          OpenMP, shared libraries)
# and the venv .deps/venv-llama with the llama-cpp-python package, installed with LLAMA_BUILD=OFF
# (no second llama.cpp build): the libraries above are linked into its llama_cpp/lib/, where the
# package loads them from (llama_cpp/llama_cpp.py; LLAMA_CPP_LIB_PATH would also do).
#
# GGML_NATIVE compiles for this host's CPU, so the stamp records the CPU flags too: on another
# host kind (Sapphire Rapids vs. AVX2-only EPYC) it rebuilds instead of dying of SIGILL.
# Does nothing when .deps/llama.cpp/stamp matches. Otherwise: a 77 MB download and a build of
# ~10-20 minutes on 2 cores (nice -n 10, -j2; MOEBATCH_BUILD_JOBS overrides).
#
# Usage: scripts/fetch_llama_cpp.sh      env: MOEBATCH_DEPS_DIR (default .deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
out="$deps/llama.cpp"
venv="$deps/venv-llama"
version=0.3.36
llama_commit=0c1e57098  # from the sdist's CHANGELOG.md
sdist=llama_cpp_python-$version.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The package's own runtime dependencies, pinned, plus what the fixture scripts use.
packages=(numpy==2.4.6 typing-extensions==4.15.0 diskcache==5.6.3 jinja2==3.1.6 MarkupSafe==3.0.3
          scikit-build-core==0.11.6 pathspec==0.12.1 packaging==25.0)
targets=(llama-perplexity llama-batched-bench llama-bench llama-quantize llama-simple
         llama-completion test-backend-ops)
jobs="${MOEBATCH_BUILD_JOBS:-2}"
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON
  -DGGML_OPENMP=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_CCACHE=OFF -DGGML_BACKEND_DL=OFF
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
  -DLLAMA_BUILD_COMMIT=$llama_commit -DLLAMA_BUILD_NUMBER=0
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN:$ORIGIN/../lib')
# No AMX: on the Sapphire Rapids hosts here (Firecracker VMs) ggml's AMX matmul
# (ggml-cpu/amx/mmq.cpp, used for Q4_0/Q4_1/Q8_0/Q4_K/... weights at batch > 1) dies of SIGILL at
# its first `tilezero`, although AMX itself works in a small test program. GGML_NATIVE has no
# per-feature switch, so -march=native is trimmed by explicit -mno-amx-* flags (GCC lets explicit
# ISA flags win over -march whatever their order); ggml then uses its AVX-512 (VNNI) kernels and
# the CPU repack path. Harmless on hosts without AMX.
if gcc -mno-amx-tile -E - < /dev/null > /dev/null 2>&1; then
  cmake_args+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
               "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi

cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort | tr '\n' ' ')"
recipe=1  # bump when the build or install steps below change in a way that matters
stamp="$({ echo "$recipe $version $sdist_sha256 $llama_commit ${packages[*]} ${targets[*]}"
  printf '%s\n' "${cmake_args[@]}" "$cpu_flags"; gcc --version | head -1; } |
  sha256sum | cut -d' ' -f1)"
report() {
  echo "fetch_llama_cpp: llama.cpp $llama_commit (llama-cpp-python $version)"
  echo "  tools:     $out/bin/{$(IFS=,; echo "${targets[*]}")}"
  echo "  libraries: $out/lib/"
  echo "  convert:   $out/llama.cpp/convert_hf_to_gguf.py (gguf-py: $out/llama.cpp/gguf-py)"
  echo "  python:    $venv/bin/python -c 'import llama_cpp'"
}
if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$venv/bin/python" ]; then
  echo "fetch_llama_cpp: up to date"
  report
  exit 0
fi

mkdir -p "$out"
rm -f "$out/stamp"
src="$out/src/llama_cpp_python-$version"
if [ ! -f "$out/$sdist" ] || ! echo "$sdist_sha256  $out/$sdist" | sha256sum -c --status; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # (pip also prepares the sdist's metadata, in an isolated env with scikit-build-core: seconds)
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$tmp" "llama-cpp-python==$version"
  got="$(sha256sum "$tmp/$sdist" | cut -d' ' -f1)"
  if [ "$got" != "$sdist_sha256" ]; then
    echo "fetch_llama_cpp: $sdist has sha256 $got, expected $sdist_sha256" >&2
    exit 1
  fi
  mv "$tmp/$sdist" "$out/$sdist"
  rm -rf "$out/src"
fi
if [ ! -d "$src" ]; then
  mkdir -p "$out/src"
  tar -xzf "$out/$sdist" -C "$out/src"
fi
ln -sfn "src/llama_cpp_python-$version/vendor/llama.cpp" "$out/llama.cpp"

# 1. llama.cpp itself (the stamp changed: build from a clean tree, the CPU may have changed).
rm -rf "$out/build" "$out/bin" "$out/lib"
start=$(date +%s)
cmake -S "$src/vendor/llama.cpp" -B "$out/build" "${cmake_args[@]}" > "$out/cmake.log" 2>&1 ||
  { tail -30 "$out/cmake.log" >&2; exit 1; }
echo "fetch_llama_cpp: building ${targets[*]} (log: $out/build.log)"
nice -n 10 cmake --build "$out/build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log" >&2; exit 1; }
echo "fetch_llama_cpp: built in $(( $(date +%s) - start )) s"
mkdir -p "$out/bin" "$out/lib"
for t in "${targets[@]}"; do cp "$out/build/bin/$t" "$out/bin/"; done
cp -P "$out"/build/bin/lib*.so* "$out/lib/"

# 2. llama-cpp-python without its own llama.cpp build, loading the libraries above.
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$venv/bin/pip" install -q \
  --disable-pip-version-check --no-deps --no-build-isolation "$src"
pkg="$("$venv/bin/python" -c 'import importlib.util as u
print(u.find_spec("llama_cpp").submodule_search_locations[0])')"
mkdir -p "$pkg/lib"
for f in "$out"/lib/lib*.so*; do ln -sfn "$f" "$pkg/lib/$(basename "$f")"; done
"$venv/bin/python" -c "import llama_cpp; assert llama_cpp.__version__ == '$version'
llama_cpp.llama_backend_init(); print('fetch_llama_cpp: llama_cpp', llama_cpp.__version__, 'loads',
llama_cpp.llama_print_system_info().decode().strip()[:200])"
echo "llama-cpp-python $version, llama.cpp $llama_commit, recipe $recipe" > "$out/version"
echo "$stamp" > "$out/stamp"
report
