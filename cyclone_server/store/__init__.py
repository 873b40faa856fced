"""The one seam to Postgres: the engine, its named SQL, migrations, notifications and the embedded server."""
