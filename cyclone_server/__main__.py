"""`python -m cyclone_server`: the same as `cyclone-server`."""

import sys

from .cli import server_main

sys.exit(server_main())
