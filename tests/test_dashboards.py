"""The Grafana dashboard queries only metrics that Ray and a running HAEPO trial export."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import ray

DASHBOARD = Path(__file__).parents[1] / "dashboards" / "haepo-training.json"
METRIC = re.compile(r"\b(ray_[a-zA-Z0-9_]+)")
# Reported by Ray's reporter agent only on nodes with GPUs.
GPU_ONLY = {"ray_node_gpus_utilization", "ray_node_gram_used"}


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    return {m for e in exprs for m in METRIC.findall(e)}


def scrape(port: int) -> set[str]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {METRIC.match(line).group(1) for line in body.splitlines() if METRIC.match(line)}


def test_dashboard_metrics_are_exported_by_a_running_trial(ray_session):
    from haepo_ray.algorithm import HAEPOConfig

    wanted = dashboard_metrics()
    assert {m for m in wanted if m.startswith("ray_haepo_")}, "the dashboard must plot HAEPO metrics"
    algo = HAEPOConfig().environment("haepo/ChainMDP-v0").build_algo()
    try:
        algo.train()
        port = ray._private.worker.global_worker.node.metrics_export_port
        deadline, exported = time.monotonic() + 60, set()
        while time.monotonic() < deadline and not (wanted - GPU_ONLY) <= exported:
            algo.train()
            exported = scrape(port)
            time.sleep(2)
    finally:
        algo.stop()
    assert wanted - GPU_ONLY <= exported, f"not exported: {sorted(wanted - GPU_ONLY - exported)}"


def test_gpu_metrics_are_rays_own():
    source = (Path(ray.__file__).parent / "dashboard" / "modules" / "reporter" / "reporter_agent.py").read_text()
    for name in GPU_ONLY & dashboard_metrics():
        assert f'"{name.removeprefix("ray_")}"' in source
