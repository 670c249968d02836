#!/usr/bin/env bash
# Installs everything the build needs on Debian 12: the -dev packages, and sentencepiece built from
# Debian's own source package against the system protobuf (Debian's libsentencepiece bundles
# protobuf-lite 3.14, which aborts any process that also links libprotobuf 3.21; see
# ../shared/docs/toolchain.md). Idempotent: a second run only checks.
#
# Usage: scripts/install_deps.sh            (installs into .deps/ under the repository root)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOEBATCH_DEPS_DIR:-$root/.deps}"
mkdir -p "$deps"

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

packages=(build-essential cmake ninja-build ccache pkg-config git curl unzip python3 python3-pip python3-venv
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libdnnl-dev catch2
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc libsqlite3-dev
  libsystemd-dev systemd prometheus-cpp-dev libcpp-httplib-dev libboost-context-dev
  libpcre2-dev libutf8proc-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- sentencepiece (static, against the system protobuf) -----------------------------------------
spm_version=0.1.97  # bookworm's; checked against the downloaded tarball below
spm_prefix="$deps/sentencepiece"
if [ ! -f "$spm_prefix/lib/libsentencepiece.a" ] || [ ! -f "$spm_prefix/.version-$spm_version" ]; then
  echo "install_deps: building sentencepiece $spm_version from Debian's source package"
  work="$deps/sentencepiece-src"
  rm -rf "$work" && mkdir -p "$work"/{etc/sources.list.d,lists/partial,cache/archives/partial}
  # A private apt configuration with a deb-src line: the system's sources stay untouched.
  cat >"$work/etc/sources.list.d/src.sources" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/etc/sources.list.d"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only sentencepiece >/dev/null)
  orig="$work/sentencepiece_$spm_version.orig.tar.gz"
  [ -f "$orig" ] || { echo "install_deps: expected $orig (Debian moved sentencepiece?)" >&2; ls "$work" >&2; exit 1; }
  tar -C "$work" -xzf "$orig"
  src="$work/sentencepiece-$spm_version"
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPM_ENABLE_SHARED=OFF \
    -DSPM_USE_BUILTIN_PROTOBUF=OFF -DSPM_ENABLE_TCMALLOC=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_CXX_FLAGS="-w" >/dev/null
  ninja -C "$src/build" sentencepiece-static >/dev/null
  rm -rf "$spm_prefix"
  install -D -m 644 "$src/build/src/libsentencepiece.a" "$spm_prefix/lib/libsentencepiece.a"
  install -D -m 644 "$src/src/sentencepiece_processor.h" "$spm_prefix/include/sentencepiece_processor.h"
  touch "$spm_prefix/.version-$spm_version"
  rm -rf "$work"
fi
echo "install_deps: ok ($deps)"
