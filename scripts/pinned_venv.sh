# Sourced by the fetch scripts: pinned_venv DIR PACKAGE... makes DIR a Python venv holding exactly
# these pinned packages (from PyPI), rebuilt when the pins change (DIR/pins records them).
pinned_venv() {
  local venv="$1"
  shift
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/pins" 2>/dev/null)" != "$*" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@"
    echo "$*" > "$venv/pins"
  fi
}
