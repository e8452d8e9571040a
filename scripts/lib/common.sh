# Shared steps of scripts/run and scripts/test: the virtual environment and the services.
# Sourced, not run.

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT=$(pwd)

find_python() {
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "Python 3.11 or newer is needed (apt-get install python3 python3-venv)." >&2
  return 1
}

# Creates .venv and installs the given requirement files, again only when they change.
ensure_venv() {
  local python stamp
  if [ ! -x .venv/bin/python ]; then
    python=$(find_python) || exit 1
    echo "Creating .venv with $python …" >&2
    "$python" -m venv .venv || exit 1
  fi
  stamp=$(cat "$@" | sha256sum | cut -c1-64)
  if [ "$(cat .venv/.requirements 2>/dev/null)" != "$stamp" ]; then
    echo "Installing $* …" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check $(printf -- '-r %s ' "$@") || exit 1
    echo "$stamp" > .venv/.requirements
  fi
  export PATH="$ROOT/.venv/bin:$PATH"
}

# Exports DATABASE_URL and REDIS_URL of services that answer (starting them if need be).
ensure_services() {
  local exports
  exports=$(python scripts/lib/services.py "$@") || exit 1
  eval "$exports"
}

# Installs the npm packages of folder $1 (its package-lock.json, exactly) into its node_modules, again only
# when the lockfile changes. Without Node.js it says what will fail and goes on: only the tests that start
# that folder's process need it.
ensure_node_packages() {
  local folder=$1 stamp
  if ! command -v npm >/dev/null 2>&1; then
    echo "No Node.js (npm): the tests that start $folder will fail (apt-get install nodejs npm)." >&2
    return 0
  fi
  stamp=$(sha256sum "$folder/package-lock.json" | cut -c1-64)
  if [ "$(cat "$folder/node_modules/.package-lock.sha256" 2>/dev/null)" != "$stamp" ]; then
    echo "Installing $folder's npm packages …" >&2
    npm ci --prefix "$folder" --no-audit --no-fund --loglevel=error || exit 1
    echo "$stamp" > "$folder/node_modules/.package-lock.sha256"
  fi
}
