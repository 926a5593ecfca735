"""The Grafana dashboard's queries return data for a running HAEPO trial.

Two levels: the metric names it queries are on Ray's metrics endpoint, and every panel's
PromQL (label filters, aggregations, template variables) returns series when evaluated by a
real Prometheus that scrapes Ray through the service-discovery file Ray writes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import ray
from helpers import free_port

DASHBOARD = Path(__file__).parents[1] / "dashboards" / "haepo-training.json"
METRIC = re.compile(r"\b(ray_[a-zA-Z0-9_]+)")
# Reported by Ray's reporter agent only on nodes with GPUs.
GPU_ONLY = {"ray_node_gpus_utilization", "ray_node_gram_used"}
# Prometheus times a scrape out after one interval: Ray's metrics endpoint can take over 1 s to
# answer on a loaded 2-core machine (then every target is "down" and every panel empty).
SCRAPE_INTERVAL_S = 3
# Grafana's built-in variables, as Grafana sets them for this scrape interval
# ($__rate_interval = max($__interval + scrape interval, 4 * scrape interval)).
BUILTINS = {"__interval": f"{SCRAPE_INTERVAL_S}s", "__rate_interval": f"{4 * SCRAPE_INTERVAL_S}s", "__range": "5m"}
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$")
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
REGEX_CHAR = re.compile(r"([\\^$*+?.()|{}\[\]])")


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def query_variables(dashboard: dict) -> dict[str, str]:
    """Template variable name -> its Grafana query, for the variables filled by a query."""
    return {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"]
            if isinstance(v.get("query"), dict)}


def dashboard_metrics() -> set[str]:
    dashboard = load_dashboard()
    exprs = [e for _, e in panel_exprs(dashboard)] + list(query_variables(dashboard).values())
    return {m for e in exprs for m in METRIC.findall(e)}


def scrape(port: int) -> set[str]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {METRIC.match(line).group(1) for line in body.splitlines() if METRIC.match(line)}


@pytest.fixture(scope="module")
def trial(ray_session):
    """A HAEPO algorithm outside Tune that has trained once, so its gauges exist."""
    from haepo_ray.rl.algorithm import HAEPOConfig

    algo = HAEPOConfig().environment("haepo/ChainMDP-v0").build_algo()
    try:
        algo.train()
        yield algo
    finally:
        algo.stop()


def exported_by(trial, wanted: set[str]) -> set[str]:
    """The metric names on this Ray's metrics endpoint once they include ``wanted`` (the
    trial trains meanwhile: gauges appear when set), else after 60 s."""
    port = ray._private.worker.global_worker.node.metrics_export_port
    deadline, exported = time.monotonic() + 60, set()
    while time.monotonic() < deadline and not wanted <= exported:
        trial.train()
        exported = scrape(port)
        time.sleep(2)
    return exported


def test_dashboard_metrics_are_exported_by_a_running_trial(trial):
    wanted = dashboard_metrics()
    assert {m for m in wanted if m.startswith("ray_haepo_")}, "the dashboard must plot HAEPO metrics"
    if not ray.cluster_resources().get("GPU"):
        wanted -= GPU_ONLY
    exported = exported_by(trial, wanted)
    assert wanted <= exported, f"not exported: {sorted(wanted - exported)}"


def test_gpu_metrics_are_gauges_that_ray_exports_under_their_name(trial):
    """Ray exports its GPU gauges only where it sees a GPU; so, on any machine: each GPU
    metric of the dashboard is ``ray_`` and a gauge of Ray's node reporter, and the running
    Ray exports that reporter's other gauges in the dashboard (CPU, memory) under such names."""
    from ray.dashboard.modules.reporter.reporter_agent import METRICS_GAUGES

    reporter = {f"ray_{name}" for name in METRICS_GAUGES}
    gpu = GPU_ONLY & dashboard_metrics()
    assert gpu <= reporter, f"not gauges of Ray's node reporter: {sorted(gpu - reporter)}"
    others = (dashboard_metrics() & reporter) - GPU_ONLY
    assert others, "the dashboard must plot node metrics of Ray's reporter"
    exported = exported_by(trial, others)
    assert others <= exported, f"not exported: {sorted(others - exported)}"


# --- the dashboard through a real Prometheus -----------------------------------------------


def _prometheus() -> str:
    binary = shutil.which("prometheus")
    if not binary:
        message = "the dashboard's Prometheus test needs Debian's prometheus package"
        if os.environ.get("CI"):
            pytest.fail(message + " (run `make prometheus`; .ci/run does)")
        pytest.skip(message)
    return binary


class Prometheus:
    """Prometheus's HTTP API on 127.0.0.1."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as error:  # Prometheus explains a bad query in the body
            body = json.loads(error.read())
        assert body["status"] == "success", (url, body)
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def variable_values(self, query: str) -> list[str]:
        """Values of a Grafana ``label_values([metric,] label)`` variable, as Grafana asks for them."""
        parsed = LABEL_VALUES.match(query)
        assert parsed, f"templating query {query!r}: only label_values(...) is supported here"
        params = {"match[]": parsed["match"]} if parsed["match"] else {}
        return self.get(f"/api/v1/label/{parsed['label']}/values", **params)


@pytest.fixture(scope="module")
def prometheus(ray_session, tmp_path_factory):
    """A Prometheus of its own (temp config and data, free port) scraping this Ray cluster.

    Its targets come from the service-discovery file that Ray's dashboard writes every few
    seconds (``prom_metrics_service_discovery.json``); the test's Ray runs without the
    dashboard, so Ray's own writer writes it once here.
    """
    from ray._private.metrics_agent import PrometheusServiceDiscoveryWriter

    binary = _prometheus()
    workdir = tmp_path_factory.mktemp("prometheus")
    node = ray._private.worker.global_worker.node
    writer = PrometheusServiceDiscoveryWriter(node.gcs_address, str(workdir), str(workdir))
    writer.write()
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": [{
            "job_name": "ray",
            "file_sd_configs": [{"files": [writer.get_target_file_name()], "refresh_interval": "1s"}],
        }],
    }))
    port = free_port()
    with (workdir / "prometheus.log").open("w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        api = Prometheus(port)
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (workdir / "prometheus.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{api.url}/-/ready", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "Prometheus not ready in 30 s"
                time.sleep(0.2)
        yield api
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's ``$name`` / ``${name}`` variables replaced from ``values``."""

    def value(match: re.Match) -> str:
        name = match[1] or match[2]
        assert name in values, f"{expr!r}: unknown template variable ${name}"
        return values[name]

    return VARIABLE.sub(value, expr)


def evaluate(api: Prometheus, dashboard: dict) -> tuple[dict[str, list[str]], dict[tuple[str, str], list]]:
    """Each query variable's values, and each panel's result with every variable set to All."""
    variables = {name: api.variable_values(q) for name, q in query_variables(dashboard).items()}
    # Grafana's All of a multi-value Prometheus variable: the values as a regex alternation,
    # regex characters escaped with a backslash that is itself escaped in the PromQL string.
    values = {name: "(" + "|".join(REGEX_CHAR.sub(r"\\\\\1", v) for v in found) + ")"
              for name, found in variables.items()}
    values.update(BUILTINS)
    return variables, {(title, expr): api.query(substitute(expr, values)) for title, expr in panel_exprs(dashboard)}


def test_every_panel_returns_series_from_prometheus(prometheus, trial):
    dashboard = load_dashboard()
    no_gpu = not ray.cluster_resources().get("GPU")
    excepted = {(t, e) for t, e in panel_exprs(dashboard) if no_gpu and set(METRIC.findall(e)) & GPU_ONLY}
    assert len(excepted) < len(panel_exprs(dashboard))

    def missing(variables, results) -> list[str]:
        return [f"variable ${name}" for name, found in variables.items() if not found] + [
            f"panel {title!r}: {expr}" for (title, expr), series in results.items()
            if not series and (title, expr) not in excepted]

    deadline = time.monotonic() + 60
    while True:
        trial.train()
        # Variables with no values yet leave an empty regex, which matches only absent labels.
        variables, results = evaluate(prometheus, dashboard)
        empty = missing(variables, results)
        if not empty or time.monotonic() > deadline:
            break
    targets = [(t["scrapeUrl"], t["health"], t["lastError"])
               for t in prometheus.get("/api/v1/targets")["activeTargets"]]
    assert not empty, f"empty in Prometheus after 60 s: {empty}; scrape targets: {targets}"
    # Each HAEPO panel shows this trial, labelled as the gauges label it.
    assert variables["trial"] == [trial.trial_id]
    for (title, expr), series in results.items():
        if "ray_haepo_" in expr:
            assert {s["metric"]["trial_id"] for s in series} == {trial.trial_id}, title
