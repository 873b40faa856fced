#!/usr/bin/env bash
# The one command that runs the whole system on this machine: an embedded Postgres (kept in
# .cyclone/pg), the Cyclone server and a demo worker. Ctrl-C stops all three.
#
#   scripts/dev.sh                            # listens on 127.0.0.1:7233
#   scripts/dev.sh --listen 127.0.0.1:9000    # any `cyclone dev` option
#
# Needs only Python 3.11+.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh

exec "$venv/bin/cyclone" dev "$@"
