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

# The venv .deps/venv-hf of the fixture scripts that need Hugging Face transformers' tokenizers and
# chat templates (scripts/fetch_chat_templates.sh, scripts/fetch_gguf_tokenizer_cases.sh): one
# venv for both, so a fresh clone installs transformers once.
HF_VENV_PACKAGES=(transformers==4.57.6 tokenizers==0.22.1 jinja2==3.1.6 gguf==0.19.0 numpy==2.3.5
                  sentencepiece==0.2.3 protobuf==7.36.2)
