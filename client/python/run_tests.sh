#!/usr/bin/env bash
# Unit tests of the Python client (package `moebatch`): creates a virtual environment, installs the
# package from this directory with its test extras (grpcio, protobuf, tqdm, pytest from PyPI; the
# gRPC modules are generated from proto/moebatch/v1/batch.proto by the build), and runs pytest.
# Needs only python3 with the venv module (Debian: python3-venv) and PyPI; no daemon.
#
# Usage: client/python/run_tests.sh [VENV_DIR] [-- PYTEST_ARGS...]
#   VENV_DIR   default: <repo>/.deps/venv-client (reused when it exists)
#   env PYTHON the interpreter that creates the venv (default: python3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.deps/venv-client"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  venv="$1"
  shift
fi
[ "${1:-}" = "--" ] && shift
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "run_tests: creating $venv with $python" >&2
  mkdir -p "$(dirname "$venv")"
  if ! "$python" -m venv "$venv"; then
    rm -rf "$venv"
    echo "run_tests: '$python -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
# A local directory is always rebuilt, so the generated modules follow the proto.
"$venv/bin/python" -m pip install --disable-pip-version-check -q "$here[test]"
cd "$here"
exec "$venv/bin/python" -m pytest -q tests "$@"
