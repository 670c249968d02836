#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (Debian packages, sentencepiece,
# the Mixtral tokenizer asset, a Python venv with the client from PyPI packages), builds everything
# (CUDA code too when nvcc is present), runs ctest, then the Python client's tests and the
# integration tests (the real moebatchd on loopback, the real Python and Go clients).
#
# Usage: scripts/test.sh            env: BUILD_DIR (default build), JOBS (default nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
export BUILD_DIR="$build"
# Each phase's wall time, so that a CI log shows where its minutes go.
phase() { echo "== test.sh: $1 (at ${SECONDS} s)"; }
phase "build"
# The test fixtures (pinned venvs of their own, PyPI downloads, Python case generation: ~4 min
# from a clean clone) are made beside the compile, once the Debian packages and the Mixtral
# tokenizer (which the GGUF tokenizer cases read) are in place; build.sh's own calls of those two
# are then no-ops.
scripts/install_deps.sh
scripts/fetch_tokenizer.sh
fixtures_log="$(mktemp)"
(
  set -e
  scripts/fetch_bpe_tokenizers.sh  # tokenizer.json files and HF tokenizers' cases for test_text
  scripts/fetch_chat_templates.sh  # real chat templates and transformers' texts for test_text
  scripts/fetch_gguf_cases.sh  # gguf-py's reading of GGUF files (SmolLM2 Q4_1 too) for test_model
  scripts/fetch_gguf_tokenizer_cases.sh  # GGUF tokenizers and HF reference ids for test_text
) >"$fixtures_log" 2>&1 &
fixtures_pid=$!
trap 'kill "$fixtures_pid" 2>/dev/null || true' EXIT  # a failed build stops them too
scripts/build.sh
phase "test fixtures"
fixtures_rc=0
wait "$fixtures_pid" || fixtures_rc=$?
trap - EXIT
cat "$fixtures_log"
rm -f "$fixtures_log"
if [ "$fixtures_rc" -ne 0 ]; then
  echo "test.sh: making the test fixtures failed (exit $fixtures_rc)" >&2
  exit 1
fi
phase "ctest"
# GPU tests carry the `gpu` label and exit 77 (skipped) where there is no device. The tests run
# side by side (-j), each with an OpenMP team of all the cores: libgomp's idle workers spin by
# default and take the cores the other test's threads need (on 2 cores the golden families' test
# took 157 s beside others, 9 s alone; the whole ctest 574 s against 325 s with passive waiting).
# The integration tests keep the default: one daemon at a time runs faster spinning.
OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" \
  ctest --test-dir "$build" --output-on-failure -j "${JOBS:-$(nproc)}"
phase "Python client"
# The client's unit tests (creates .deps/venv-client and installs the package into it), then the
# integration tests with the same venv.
client/python/run_tests.sh "$root/.deps/venv-client"
phase "Go client"
# The Go client: Debian's Go packages, generated code, moebatch-go, go vet and its unit tests.
client/go/build.sh "$build/client-go"
# promtool (Debian's prometheus package) lints the daemon's metrics in the integration tests.
if ! command -v promtool >/dev/null; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  install_promtool() {
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
      --no-install-recommends prometheus >/dev/null
  }
  install_promtool || { "${sudo_cmd[@]}" apt-get update -qq && install_promtool; }
fi
phase "integration tests"
# The HTTP API's tests drive the daemon with the official OpenAI SDK (into the client's venv) and
# with LiteLLM (a venv of its own: its pins would move the client's packages). `moebatch shard`'s
# tests (test_ray_shard.py) need the client's `ray` extra, pinned here to the tested release.
"$root/.deps/venv-client/bin/python" -m pip install -q --disable-pip-version-check \
  "openai==3.57.0" "ray[default]==2.60.0"
source scripts/pinned_venv.sh
pinned_venv "$root/.deps/venv-litellm" "litellm==1.110.2"
MOEBATCH_GO_CLIENT="$build/client-go/moebatch-go" MOEBATCH_BUILD_DIR="$build" \
  MOEBATCH_LITELLM_PYTHON="$root/.deps/venv-litellm/bin/python" \
  "$root/.deps/venv-client/bin/python" -m pytest -q --durations=15 tests/integration
phase "deploy and scale-out checks"
# deploy/k8s against the Kubernetes and KubeRay schemas and moebatchd's flags (.deps/venv-k8s).
scripts/validate_k8s.sh
# The 100-host simulation (bench/scale_out_sim.py), run small, with the real moebatch-plan.
MOEBATCH_BUILD_DIR="$build" "$root/.deps/venv-client/bin/python" -m pytest -q tests/bench
# libFuzzer targets (tests/fuzz): clang build in build-fuzz, 30 s each here (scripts/fuzz.sh alone:
# 60), fails on any crash.
phase "fuzz"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}" scripts/fuzz.sh
phase "done"
