#!/usr/bin/env bash
# Builds the Go client of moebatchd (package moebatch/client/go and the CLI moebatch-go) offline,
# from Debian 12's Go packages: no module proxy, no network besides apt.
#
#   1. installs the Debian packages it needs when they are missing (sudo only when not root);
#   2. generates the gRPC code from proto/moebatch/v1/batch.proto into client/go/moebatchv1/
#      (ignored by git: client/go/.gitignore);
#   3. checks gofmt, builds the packages and the binary OUT_DIR/moebatch-go;
#   4. runs `go vet` and the unit tests (`go test`), unless --no-test.
#
# Usage: client/go/build.sh [--no-test] [OUT_DIR]      OUT_DIR default: client/go/bin
#
# The build runs in GOPATH mode (GO111MODULE=off) with GOPATH=<a temporary dir>:/usr/share/gocode,
# where Debian installs the sources of grpc, protobuf and their dependencies; the temporary dir only
# holds the symlink src/moebatch/client/go -> client/go, the import path of go_package in the proto.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

run_tests=1
out=""
for arg in "$@"; do
  case "$arg" in
    --no-test) run_tests=0 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "build.sh: unknown option $arg" >&2; exit 2 ;;
    *)
      if [ -n "$out" ]; then echo "build.sh: one OUT_DIR at most" >&2; exit 2; fi
      out="$arg" ;;
  esac
done
out="${out:-$here/bin}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

log() { echo "build.sh: $*" >&2; }

# -- 1. Debian packages ------------------------------------------------------------------------
# golang-github-golang-protobuf-1-5-dev is named explicitly: apt would otherwise satisfy grpc's
# dependency with 1-3, whose github.com/golang/protobuf panics at run time against protobuf 1.28.
packages=(golang-go golang-google-grpc-dev golang-google-protobuf-dev
          golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { log "not root and no sudo: install ${missing[*]}"; exit 1; }
    sudo=(sudo)
  fi
  apt_install() {
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
      install -y --no-install-recommends "${missing[@]}"
  }
  # Package lists may be missing (a fresh container) or stale: update once and retry.
  if ! apt_install; then
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update
    apt_install
  fi
fi

# -- 2. generated code -------------------------------------------------------------------------
gen="$here/moebatchv1"
tmp_gen="$(mktemp -d)"
gopath="$(mktemp -d)"
trap 'rm -rf "$tmp_gen" "$gopath"' EXIT
# module=... strips the go_package prefix, so the files land in $tmp_gen/moebatchv1/.
protoc -I "$root/proto" \
  --go_out="$tmp_gen" --go_opt=module=moebatch/client/go \
  --go-grpc_out="$tmp_gen" --go-grpc_opt=module=moebatch/client/go \
  "$root/proto/moebatch/v1/batch.proto"
mkdir -p "$gen"
for f in "$tmp_gen"/moebatchv1/*.go; do
  # Replaced only when changed (keeps go's build cache warm), atomically (concurrent builds).
  if ! cmp -s "$f" "$gen/$(basename "$f")"; then
    cp "$f" "$gen/.$(basename "$f").tmp"
    mv -f "$gen/.$(basename "$f").tmp" "$gen/$(basename "$f")"
  fi
done

# -- 3. build ----------------------------------------------------------------------------------
mkdir -p "$gopath/src/moebatch/client"
ln -s "$here" "$gopath/src/moebatch/client/go"
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS="" GOPROXY=off
if [ -z "$(go env GOCACHE 2>/dev/null)" ] || [ "$(go env GOCACHE 2>/dev/null)" = off ]; then
  export GOCACHE="$root/.deps/go-build-cache"  # no $HOME (e.g. a service account)
fi
pkgs=(moebatch/client/go moebatch/client/go/moebatchv1 moebatch/client/go/internal/testserver
      moebatch/client/go/cmd/moebatch-go)

unformatted="$(cd "$here" && find . -path ./moebatchv1 -prune -o -path ./bin -prune \
  -o -name '*.go' -print0 | xargs -0 gofmt -l)"
if [ -n "$unformatted" ]; then
  log "not gofmt'd (run gofmt -w): $unformatted"
  exit 1
fi
cd "$gopath/src/moebatch/client/go"
go build "${pkgs[@]}"
go build -o "$out/moebatch-go" moebatch/client/go/cmd/moebatch-go
log "built $out/moebatch-go ($(go version | cut -d' ' -f3))"

# -- 4. vet and unit tests ---------------------------------------------------------------------
if [ "$run_tests" = 1 ]; then
  go vet "${pkgs[@]}"
  go test -count=1 "${pkgs[@]}"
fi
