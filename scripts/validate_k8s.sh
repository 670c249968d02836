#!/usr/bin/env bash
# Validates the Kubernetes manifests under deploy/k8s (tests/deploy/test_k8s_manifests.py): every
# manifest against the Kubernetes JSON schemas of pinned versions in strict mode (the PyPI package
# kubernetes-validate, which bundles the schemas: no cluster, no network at test time), the KubeRay
# RayCluster and RayJob against tests/deploy/kuberay_v1_schema.json plus their pod templates as
# core/v1, the kustomizations rendered by `kubectl kustomize` where kubectl is installed, and the
# manifests' consistency (Service and StatefulSet, the driver's --servers, moebatchd's flags).
#
# Usage: scripts/validate_k8s.sh [PYTEST_ARGS...]
#   env BUILD_DIR   the build whose server/moebatchd --help lists the real flags (default build)
#   env K8S_VENV    the venv (default .deps/venv-k8s), rebuilt when the pins change
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
venv="${K8S_VENV:-$root/.deps/venv-k8s}"
source scripts/pinned_venv.sh
pinned_venv "$venv" "kubernetes-validate==1.37.0" "pytest==9.2.0"
MOEBATCH_BUILD_DIR="$build" exec "$venv/bin/python" -m pytest -q tests/deploy/test_k8s_manifests.py \
  "$@"
