#!/usr/bin/env bash
# Builds the Go client of moebatchd (the module of go.mod: the package moebatch/client/go and the
# CLI moebatch-go) offline, from Debian 12's Go packages: no module proxy, no network besides apt.
#
#   1. installs the Debian packages it needs when they are missing (sudo only when not root);
#   2. generates the gRPC code from proto/moebatch/v1/batch.proto into client/go/moebatchv1/
#      (ignored by git: client/go/.gitignore);
#   3. makes client/go/vendor/ (ignored by git), checks gofmt, builds the packages and the binary
#      OUT_DIR/moebatch-go;
#   4. runs `go vet` and the unit tests (`go test`), unless --no-test.
#
# Usage: client/go/build.sh [--no-test] [OUT_DIR]      OUT_DIR default: client/go/bin
#
# The build runs in module mode with -mod=vendor and GOPROXY=off. vendor/ holds one symlink per
# module that go.mod requires, to its source in /usr/share/gocode/src (where Debian installs grpc,
# protobuf and their dependencies), and a vendor/modules.txt that lists each module at go.mod's
# version with its packages and the go version of its own go.mod.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

run_tests=1
out=""
for arg in "$@"; do
  case "$arg" in
    --no-test) run_tests=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
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
# The module path is go.mod's; the proto's go_package is mapped onto it (M...), so the files land
# in $tmp_gen/moebatchv1/ (module=... strips the module path) whatever go_package says.
modpath="$(sed -n 's/^module[[:space:]]\{1,\}"\{0,1\}\([^"[:space:]]*\).*/\1/p' "$here/go.mod" |
  head -n 1)"
[ -n "$modpath" ] || { log "no module line in $here/go.mod"; exit 1; }
proto="moebatch/v1/batch.proto"
gopkg="$modpath/moebatchv1;moebatchv1"
if ! grep -q "^option go_package = \"$gopkg\";" "$root/proto/$proto"; then
  log "note: the go_package of proto/$proto is not \"$gopkg\" (go.mod's module path); mapped"
fi
gen="$here/moebatchv1"
tmp_gen="$(mktemp -d)"
tmp_vendor=""
trap 'rm -rf "$tmp_gen" ${tmp_vendor:+"$tmp_vendor"}' EXIT
protoc -I "$root/proto" \
  --go_out="$tmp_gen" --go_opt="M$proto=$gopkg" --go_opt=module="$modpath" \
  --go-grpc_out="$tmp_gen" --go-grpc_opt="M$proto=$gopkg" --go-grpc_opt=module="$modpath" \
  "$root/proto/$proto"
mkdir -p "$gen"
for f in "$tmp_gen"/moebatchv1/*.go; do
  # Replaced only when changed (keeps go's build cache warm), atomically (concurrent builds).
  if ! cmp -s "$f" "$gen/$(basename "$f")"; then
    cp "$f" "$gen/.$(basename "$f").$$.tmp"
    mv -f "$gen/.$(basename "$f").$$.tmp" "$gen/$(basename "$f")"
  fi
done

# -- 3. vendor/ and build ----------------------------------------------------------------------
gocode=/usr/share/gocode/src
# go.mod's requirements, "path version" per line (the require block and single require lines).
requires() {
  awk '/^require[[:space:]]*\(/ { block = 1; next }
       block && /^[[:space:]]*\)/ { block = 0; next }
       block && NF >= 2 && $1 !~ /^\/\// { print $1, $2; next }
       !block && $1 == "require" && NF >= 3 && $2 != "(" { print $2, $3 }' "$here/go.mod" |
    tr -d '"'
}
# Warns when the Debian package that installed module $1 is not at go.mod's version $2: go.mod and
# vendor/modules.txt would then name a version that is not the one built.
check_debian_version() {
  local m="$1" v="$2" pkg deb up date hash
  pkg="$(dpkg-query -S "$gocode/$m/go.mod" 2>/dev/null | head -n 1 | cut -d: -f1)" || true
  [ -n "$pkg" ] || { log "warning: no Debian package owns $gocode/$m (go.mod: $m $v)"; return 0; }
  deb="$(dpkg-query -W -f='${Version}' "$pkg")"
  up="$(echo "$deb" | sed 's/^[0-9]*://; s/-[^-]*$//; s/[+~]\(dfsg\|ds\).*//')"
  if [[ "$up" =~ ^0\.0~git([0-9]{8})\.([0-9a-f]+)$ ]]; then  # a snapshot: v0.0.0-DATE...-HASH
    date="${BASH_REMATCH[1]}" hash="${BASH_REMATCH[2]}"
    [[ "$v" =~ -${date}[0-9]{6}-${hash} ]] && return 0
  elif [ "v$up" = "$v" ]; then
    return 0
  fi
  log "warning: go.mod requires $m $v, but $pkg is $deb: update go.mod"
}
# vendor/ as it should be, made in a temporary directory beside it.
tmp_vendor="$(mktemp -d "$here/.vendor.XXXXXX")"
chmod 755 "$tmp_vendor"  # mktemp's 700 would hide it from other users' builds
modules=()
while read -r m v; do
  if [ ! -f "$gocode/$m/go.mod" ]; then
    log "go.mod requires $m, which is not in $gocode (no Debian package installed for it)"
    exit 1
  fi
  check_debian_version "$m" "$v"
  modules+=("$m")
  mkdir -p "$tmp_vendor/$(dirname "$m")"
  ln -s "$gocode/$m" "$tmp_vendor/$m"
  gov="$(sed -n 's/^go[[:space:]]\{1,\}\([0-9.]*\).*/\1/p' "$gocode/$m/go.mod" | head -n 1)"
  {
    echo "# $m $v"
    echo "## explicit${gov:+; go $gov}"
    # Its packages: the directories with .go files, without testdata, vendor, _x and .x ones.
    (cd "$gocode/$m" && find . \( -name testdata -o -name vendor -o -name '[._]?*' \) -prune \
       -o -type f -name '*.go' -print) | sed 's#/[^/]*$##; s#^\.#'"$m"'#' | LC_ALL=C sort -u
  } >> "$tmp_vendor/modules.txt"
done < <(requires)
vendor_current() {  # vendor/ is the one just made (same modules.txt, same links)
  cmp -s "$tmp_vendor/modules.txt" "$here/vendor/modules.txt" || return 1
  local m
  for m in "${modules[@]}"; do
    [ "$(readlink "$here/vendor/$m")" = "$gocode/$m" ] || return 1
  done
}
# Made aside and moved in whole; of builds running side by side, the first to move its vendor/ in
# wins and the others take it when it is the same.
if ! vendor_current && ! mv -T "$tmp_vendor" "$here/vendor" 2>/dev/null && ! vendor_current; then
  old="$here/.vendor.old.$$"  # a stale vendor/ (go.mod or a Debian package changed)
  mv -T "$here/vendor" "$old" 2>/dev/null || true
  if ! mv -T "$tmp_vendor" "$here/vendor" 2>/dev/null && ! vendor_current; then
    log "could not replace $here/vendor"
    exit 1
  fi
  rm -rf "$old"
fi

export GO111MODULE=on GOFLAGS=-mod=vendor GOPROXY=off GOSUMDB=off GOWORK=off GOTOOLCHAIN=local
if [ -z "$(go env GOCACHE 2>/dev/null)" ] || [ "$(go env GOCACHE 2>/dev/null)" = off ]; then
  export GOCACHE="$root/.deps/go-build-cache"  # no $HOME (e.g. a service account)
fi
pkgs=("$modpath" "$modpath/moebatchv1" "$modpath/internal/testserver" "$modpath/cmd/moebatch-go")

unformatted="$(cd "$here" && find . \( -path ./moebatchv1 -o -path ./bin -o -path ./vendor \
  -o -path './.vendor.*' \) -prune -o -name '*.go' -print0 | xargs -0 gofmt -l)"
if [ -n "$unformatted" ]; then
  log "not gofmt'd (run gofmt -w): $unformatted"
  exit 1
fi
cd "$here"
go build "${pkgs[@]}"
go build -o "$out/moebatch-go" "$modpath/cmd/moebatch-go"
log "built $out/moebatch-go ($(go version | cut -d' ' -f3))"

# -- 4. vet and unit tests ---------------------------------------------------------------------
if [ "$run_tests" = 1 ]; then
  go vet "${pkgs[@]}"
  go test -count=1 "${pkgs[@]}"
fi
