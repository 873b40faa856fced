"""The workers registry (cyclone_workers_beat): who writes a worker's row, and when it goes.

Integration: the engine's calls against a real database, as the servers' hubs make them.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone
from typing import Any

from cyclone_server.store.engine import Engine


def row(worker_id: str, conn_id: str, *, kinds: list[str], slots: int = 4, held: int = 0) -> dict[str, Any]:
    return {"worker_id": worker_id, "conn_id": conn_id, "sdk": "test/1", "kinds": kinds, "slots": slots,
            "leases_held": held, "connected_at": datetime.now(timezone.utc).isoformat()}


async def test_a_reconnect_elsewhere_takes_the_row_and_the_old_streams_beats_leave_it(engine: Engine) -> None:
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    assert await engine.workers_beat("server-a", [row("w1", old, kinds=["mail"])], 60, takeover=True) == 1
    assert await engine.workers_beat("server-b", [row("w1", new, kinds=["mail", "sms"])], 60, takeover=True) == 1
    # Server A has not noticed its stream died: its heartbeat must not take the row back.
    assert await engine.workers_beat("server-a", [row("w1", old, kinds=["mail"], held=3)], 60) == 0
    [w] = await engine.list_workers()
    assert (w["server_id"], w["kinds"], w["leases_held"]) == ("server-b", ["mail", "sms"], 0)
    assert await engine.workers_beat("server-b", [row("w1", new, kinds=["mail", "sms"], held=2)], 60) == 1
    assert (await engine.list_workers("sms"))[0]["leases_held"] == 2
    assert await engine.list_workers("push") == []


async def test_rows_expire_after_the_grace_and_any_servers_beat_deletes_them(engine: Engine, conn: Any) -> None:
    await engine.workers_beat("crashed", [row("w2", str(uuid.uuid4()), kinds=["mail"])], 0.2, takeover=True)
    assert [w["worker_id"] for w in await engine.list_workers()] == ["w2"]
    await engine.enqueue("mail")
    [stats] = await engine.stats()
    assert (stats["workers"], stats["free_slots"]) == (1, 4)
    deadline = asyncio.get_running_loop().time() + 30
    while await engine.list_workers():  # the grace passes with no heartbeat of its server
        assert asyncio.get_running_loop().time() < deadline, "the row outlived its grace"
        await asyncio.sleep(0.05)
    [stats] = await engine.stats()
    assert stats["workers"] == 0
    await engine.workers_beat("alive", [], 60)  # another server's heartbeat cleans up
    assert (await (await conn.execute("SELECT count(*) FROM cyclone_workers")).fetchone())[0] == 0
