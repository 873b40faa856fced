"""The web console: runs, their DAGs, workflows, backlog and run actions, served by cyclone-server on its HTTP port.

`Console(engine, ...)` builds the aiohttp application (web.py), `serve_console` starts it on
the server's own event loop; graph.py lays a DAG out and draws it as SVG. See docs/console.md.
"""

from .web import Console, HttpServer, serve_console

__all__ = ["Console", "HttpServer", "serve_console"]
