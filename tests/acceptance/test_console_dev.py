"""`cyclone dev` serves the web console by default and prints its address."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from cyclone_server.cli.main import DEV_HTTP_LISTEN


def test_cyclone_dev_prints_and_serves_the_console(tmp_path: Path) -> None:
    assert DEV_HTTP_LISTEN == "127.0.0.1:8233"  # the documented default
    # Port 0 here: the default port may be taken on a shared machine.
    proc = subprocess.Popen([sys.executable, "-c", "from cyclone_server.cli.main import main; raise SystemExit(main())",
                             "dev", "--data-dir", str(tmp_path / "pg"), "--listen", "127.0.0.1:0",
                             "--http-listen", "127.0.0.1:0", "--no-worker"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen, url = [], None
    try:
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)
                continue
            seen.append(line)
            m = re.match(r"Web console: (http://127\.0\.0\.1:\d+)/$", line.strip())
            url = m.group(1) if m else None
        assert url, "no console address printed:\n" + "".join(seen)
        with urllib.request.urlopen(url + "/healthz", timeout=30) as r:
            assert r.status == 200 and r.read() == b"ok\n"
        with urllib.request.urlopen(url + "/runs", timeout=30) as r:
            assert r.status == 200 and b"<h1>Runs</h1>" in r.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
