#!/usr/bin/env bash
# Installs moebatchd as a systemd service (docs/operations.md):
#   /usr/local/bin/moebatchd, moebatch-run, moebatch-plan,
#                  moebatch-token                           the programs (from --build-dir)
#   /etc/systemd/system/moebatchd.service                   deploy/moebatchd.service
#   /etc/moebatch/moebatchd.json                            deploy/moebatchd.json (kept if present)
#   /etc/moebatch/tokens.json                               no tokens yet (kept if present; add
#                                                           them with moebatch-token)
#   /usr/local/share/doc/moebatch/operations.md             docs/operations.md
#   user and group `moebatch`; /var/lib/moebatch is the unit's StateDirectory
# then `systemctl daemon-reload`. Run as root after ./scripts/build.sh. Start it with
# `systemctl enable --now moebatchd` once the config names your model.
#
# Usage: deploy/install.sh [--build-dir DIR] [--destdir DIR]
#   --destdir DIR   install under DIR (a staging root: no user, no systemctl), for packaging/tests
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
destdir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --destdir) destdir="$2"; shift 2 ;;
    *) echo "install.sh: unknown argument $1 (see the header of deploy/install.sh)" >&2; exit 2 ;;
  esac
done
for program in server/moebatchd server/moebatch-token engine/moebatch-run engine/moebatch-plan; do
  if [ ! -x "$build/$program" ]; then
    echo "install.sh: $build/$program is not built (run ./scripts/build.sh first)" >&2
    exit 1
  fi
done
if [ -z "$destdir" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (or with --destdir)" >&2
  exit 1
fi

install -d "$destdir/usr/local/bin" "$destdir/etc/systemd/system" "$destdir/etc/moebatch" \
  "$destdir/usr/local/share/doc/moebatch"
install -m 0755 "$build/server/moebatchd" "$build/server/moebatch-token" \
  "$build/engine/moebatch-run" "$build/engine/moebatch-plan" "$destdir/usr/local/bin/"
install -m 0644 "$root/deploy/moebatchd.service" "$destdir/etc/systemd/system/moebatchd.service"
if [ -e "$destdir/etc/moebatch/moebatchd.json" ]; then
  echo "install.sh: keeping the existing /etc/moebatch/moebatchd.json"
else
  install -m 0640 "$root/deploy/moebatchd.json" "$destdir/etc/moebatch/moebatchd.json"
fi
if [ ! -e "$destdir/etc/moebatch/tokens.json" ]; then
  # Digests only, but who may call is still the operator's business: not world-readable.
  printf '{"tokens": []}\n' >"$destdir/etc/moebatch/tokens.json"
  chmod 0640 "$destdir/etc/moebatch/tokens.json"
fi
install -m 0644 "$root/docs/operations.md" "$destdir/usr/local/share/doc/moebatch/operations.md"

if [ -z "$destdir" ]; then
  if ! getent passwd moebatch >/dev/null; then
    useradd --system --home-dir /var/lib/moebatch --shell /usr/sbin/nologin moebatch
  fi
  chgrp moebatch /etc/moebatch/moebatchd.json /etc/moebatch/tokens.json
  systemctl daemon-reload
  echo "install.sh: installed; edit /etc/moebatch/moebatchd.json, add tokens with"
  echo "  moebatch-token --tenant NAME --tokens_file /etc/moebatch/tokens.json"
  echo "then: systemctl enable --now moebatchd (and systemctl reload moebatchd after new tokens)"
else
  echo "install.sh: staged under $destdir"
fi
