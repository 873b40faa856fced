"""`python -m cyclone_server`: the same as `cyclone-server`."""

import sys

from cyclone_server.cli.main import server_main

sys.exit(server_main())
