#!/usr/bin/env bash
# Installs what the console's browser tests need, when it is missing: Debian's chromium and
# chromium-driver (apt, as root), and selenium in the venv. Idempotent: a second run only checks.
#   bash scripts/setup_browser.sh            # uses ./.venv/bin/python, else python3
#   PYTHON=/path/to/python bash scripts/setup_browser.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup_browser: chromium or chromedriver is missing and this is not root: apt-get install chromium chromium-driver" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
fi

if ! "$PY" -c "import selenium" >/dev/null 2>&1; then
  # The venv may be shared by several processes: one pip at a time. scripts/test.sh holds the
  # same lock while pytest runs (and pytest runs this script), so wait a minute at most.
  venv="$(dirname "$PY")/.."
  if command -v flock >/dev/null 2>&1 && [ -f "$venv/pyvenv.cfg" ]; then
    flock -w 60 "$venv/.lock" "$PY" -m pip install -q 'selenium>=4.20,<5' \
      || "$PY" -m pip install -q 'selenium>=4.20,<5'
  else
    "$PY" -m pip install -q 'selenium>=4.20,<5'
  fi
fi
echo "setup_browser: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | head -1 | cut -d' ' -f1-2), selenium $("$PY" -c 'import selenium; print(selenium.__version__)')"
