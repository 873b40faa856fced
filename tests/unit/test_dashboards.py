"""deploy/grafana and deploy/prometheus: every series they query is one the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cyclone_server.serve.metrics import Metrics, Snapshot

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERIES = re.compile(r"\b((?:cyclone|process)_[a-z_]+)\b")


def exported_families() -> set[str]:
    text = Metrics().expose(Snapshot(ok=True)).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def family(series: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", series)


def test_the_dashboard_queries_only_exported_series() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "cyclone-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {family(s) for e in exprs for s in SERIES.findall(e)}
    assert {"cyclone_kind_workers", "cyclone_kinds_without_workers", "cyclone_step_duration_seconds",
            "cyclone_queue_wait_seconds", "cyclone_runs_ended_total", "cyclone_oldest_available_age_seconds",
            "cyclone_limit_running", "cyclone_limit_max_running", "cyclone_limit_waiting",
            "cyclone_limit_oldest_waiting_seconds"} <= used
    assert used - exported_families() == set()


def test_the_alert_rules_query_only_exported_series() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "cyclone-alerts.yml").read_text())["groups"][0]["rules"]
    assert {"CycloneBacklogAge", "CycloneKindWithoutWorkers", "CycloneLimitKeyWaitsLong"} <= {r["alert"] for r in rules}
    used = {family(s) for r in rules for s in SERIES.findall(r["expr"])}
    assert used - exported_families() == set()
