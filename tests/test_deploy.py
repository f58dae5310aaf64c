"""Deploy files that start as shipped, checked without a Docker daemon or a cluster.

- compose.yaml is validated against the compose-spec JSON schema vendored by check-jsonschema
  (its CLI, as pre-commit runs it), Kubernetes objects against the OpenAPI-derived schemas
  vendored by kubernetes-validate (strict: unknown fields fail), Dockerfiles parsed with
  dockerfile-parse;
- then the files are checked against each other and against the app: every config they ship
  loads through gateway.config.settings, ports, probe and health paths, config paths, env names,
  Secret/ConfigMap/PVC/Service names and selectors agree;
- the image's command runs here as the image would run it: without a key it prints one line
  saying what to set and exits 2; with a key file it serves and enforces the key.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import load_settings
from schemas.config import PoolEngineConfig, Settings, StaticEngineConfig
from tests.conftest import ROOT, free_port, stop_process, wait_http_ok

DEPLOY = ROOT / "deploy"
DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.gpu"]
K8S_FILES = sorted((DEPLOY / "k8s").glob("*.yaml"))
K8S_VERSION = "1.34.0"


def app_paths() -> set[str]:
    app = create_app(Settings(), configure_logs=False)
    return {route.path for route in app.routes}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANK_")}
    return {**env, **extra}


def settings_from_text(text: str, tmp_path: Path, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / f"config-{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(text)
    return load_settings(path, environ=environ or {})


# -- Dockerfiles ------------------------------------------------------------------------------
def dockerfile(path: Path) -> DockerfileParser:
    parser = DockerfileParser(fileobj=path.open("rb"))
    return parser


def instructions(parser: DockerfileParser, name: str) -> list[str]:
    return [i["value"] for i in parser.structure if i["instruction"] == name]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_agrees_with_the_app(path: Path, tmp_path: Path) -> None:
    parser = dockerfile(path)
    env = parser.envs
    config_path = env["RERANK_CONFIG"]
    copies = [v.split() for v in instructions(parser, "COPY")]
    for *sources, _dest in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such file in the repository"
    (config_source,) = [src for *srcs, dest in copies for src in srcs if dest == config_path]
    environ = {k: v for k, v in env.items() if k.startswith("RERANK_MODELS__")}
    settings = load_settings(ROOT / config_source, environ=environ)
    assert settings.server.host == "0.0.0.0"
    assert instructions(parser, "EXPOSE") == [str(settings.server.port)]
    (healthcheck,) = instructions(parser, "HEALTHCHECK")
    url = urlparse(re.search(r"http://[^']+", healthcheck).group(0))
    assert url.port == settings.server.port and url.path in app_paths()
    cmd = instructions(parser, "CMD")[-1]
    assert cmd == '["rerank-gateway", "serve"]'
    if path.name.endswith(".gpu"):
        assert instructions(parser, "ENTRYPOINT") == ["[]"]  # vLLM's image would run `vllm serve`
        assert type(settings.models[0]).__struct_config__.tag == "packed"
    else:
        assert type(settings.models[0]).__struct_config__.tag == "transformers"
        assert "download.pytorch.org/whl/cpu" in parser.args["TORCH_INDEX"]


def run_image_command(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve"],
        check=False,
        cwd=ROOT,
        env=clean_env(RERANK_CONFIG=str(DEPLOY / "gateway.docker.toml"), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_image_without_a_key_prints_one_line_and_exits() -> None:
    done = run_image_command({})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "RERANK_API_KEY" in lines[0] and "RERANK_API_KEY_FILE" in lines[0]


@pytest.mark.slow
def test_image_with_the_k8s_placeholder_secret_refuses_in_one_line(tmp_path: Path) -> None:
    (secret,) = [d for d in k8s_objects() if d["kind"] == "Secret"]
    placeholder = tmp_path / "api-key"
    placeholder.write_text(secret["stringData"]["api-key"])
    done = run_image_command({"RERANK_API_KEY_FILE": str(placeholder)})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "RERANK_API_KEY_FILE" in lines[0], done.stderr


@pytest.mark.slow
def test_image_with_a_key_file_serves_and_enforces_it(tmp_path: Path) -> None:
    key = "rk-" + "k" * 40
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")  # as `kubectl create secret --from-file` would keep a newline
    port = free_port()
    env = clean_env(
        RERANK_CONFIG=str(DEPLOY / "gateway.docker.toml"),
        RERANK_API_KEY_FILE=str(key_file),
        # Loopback in tests; the image binds 0.0.0.0 (checked above: allowed because a key is set).
        RERANK_SERVER__HOST="127.0.0.1",
        RERANK_SERVER__PORT=str(port),
        HF_HUB_OFFLINE="1",
    )
    log = (tmp_path / "out.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", proc, deadline=time.monotonic() + 90, what="gateway")
        body = {"model": "qwen3-reranker-0.6b", "query": "q", "documents": ["d"]}
        assert httpx.post(f"{url}/v2/rerank", json=body, timeout=10).status_code == 401
        # The key is accepted; the model itself needs weights mounted at /models (503 says so).
        resp = httpx.post(f"{url}/v2/rerank", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert resp.status_code in (503,), resp.text
    finally:
        stop_process(proc)
        log.close()
    assert key not in (tmp_path / "out.log").read_text()


# -- compose ----------------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_validates_against_the_compose_spec() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(DEPLOY / "compose.yaml"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_services_agree_with_each_other_and_the_app(tmp_path: Path) -> None:
    doc = compose()
    services = doc["services"]
    assert {"gateway", "vllm", "redis", "prometheus", "grafana"} <= set(services)
    gateway = services["gateway"]
    assert (ROOT / gateway["build"]["context"].replace("..", ".") / gateway["build"]["dockerfile"]).exists()
    env = gateway["environment"]
    (config_ref,) = [c for c in gateway["configs"] if c["target"] == env["RERANK_CONFIG"]]
    config_file = DEPLOY / doc["configs"][config_ref["source"]]["file"]
    settings = load_settings(config_file, environ={})
    # The key file is the secret compose mounts at /run/secrets/<name>.
    (secret,) = gateway["secrets"]
    assert env["RERANK_API_KEY_FILE"] == f"/run/secrets/{secret}"
    assert doc["secrets"][secret]["file"].startswith("./secrets/")
    assert "deploy/secrets/" in (ROOT / ".gitignore").read_text()
    assert any(p.endswith(f":{settings.server.port}") for p in gateway["ports"])
    probe = next(a for a in gateway["healthcheck"]["test"] if "http://" in a)
    url = urlparse(re.search(r"http://[^']+", probe).group(0))
    assert url.port == settings.server.port and url.path in app_paths()
    # The pool points at the vllm service on the port it serves, with the template shipped here.
    (model,) = settings.models
    assert isinstance(model, PoolEngineConfig) and model.protocol == "vllm"
    vllm_args = services["vllm"]["command"]
    arg = lambda name: vllm_args[vllm_args.index(name) + 1]
    upstream = urlparse(model.urls[0])
    assert upstream.hostname == "vllm" and upstream.port == int(arg("--port"))
    assert model.model == arg("--served-model-name") and arg("--runner") == "pooling"
    template = arg("--chat-template")
    mounts = {m.split(":")[1]: m.split(":")[0] for m in services["vllm"]["volumes"]}
    assert (DEPLOY / mounts[template]).resolve() == (DEPLOY / "qwen3_reranker.jinja").resolve()
    # Redis: limits and the cache use the redis service.
    assert urlparse(settings.limits.redis_url).hostname == "redis" and settings.cache.backend == "redis"
    # Prometheus scrapes the gateway's /metrics; Grafana gets the datasource and the dashboard.
    prom_ref = services["prometheus"]["configs"][0]
    prom = yaml.safe_load((DEPLOY / doc["configs"][prom_ref["source"]]["file"]).read_text())
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == [
        f"gateway:{settings.server.port}"
    ]
    grafana = {m.split(":")[1]: DEPLOY / m.split(":")[0] for m in services["grafana"]["volumes"]}
    provisioning = grafana["/etc/grafana/provisioning"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "rerank-gateway.yaml").read_text())["providers"]
    dashboard = grafana[f"{provider['options']['path']}/rerank-gateway.json"]
    assert dashboard.resolve() == (DEPLOY / "grafana" / "rerank-gateway.json").resolve()
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert urlparse(datasource["url"]).hostname == "prometheus"


# -- Kubernetes -------------------------------------------------------------------------------
def k8s_objects() -> list[dict[str, Any]]:
    return [d for path in K8S_FILES for d in yaml.safe_load_all(path.read_text()) if d]


def test_every_k8s_object_validates_against_its_schema() -> None:
    objects = k8s_objects()
    kinds = {d["kind"] for d in objects}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget", "PersistentVolumeClaim"} <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_k8s_schema_validation_catches_mistakes() -> None:
    """The validator is really checking: a typo'd field and a wrong type are refused."""
    deployment = next(d for d in k8s_objects() if d["kind"] == "Deployment")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    wrong = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSION, strict=True)


def gateway_deployments() -> list[dict[str, Any]]:
    return [
        d for d in k8s_objects() if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("rerank-gateway")
    ]


def test_k8s_manifests_define_what_they_reference(tmp_path: Path) -> None:
    objects = k8s_objects()
    names = {(d["kind"], d["metadata"]["name"]) for d in objects}
    paths = app_paths()
    deployments = gateway_deployments()
    assert {d["metadata"]["name"] for d in deployments} == {"rerank-gateway", "rerank-gateway-gpu"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (container,) = pod["spec"]["containers"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        for volume in volumes.values():
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "secret" in volume:
                assert ("Secret", volume["secret"]["secretName"]) in names
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
        env = {e["name"]: e["value"] for e in container["env"]}
        # RERANK_CONFIG is the ConfigMap's key under its mount; it loads through gateway.config.settings.
        config_dir, config_key = env["RERANK_CONFIG"].rsplit("/", 1)
        config_map = next(
            d
            for d in objects
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == mounts[config_dir]["configMap"]["name"]
        )
        settings = settings_from_text(config_map["data"][config_key], tmp_path)
        # The key file is the Secret's key under its mount, and the Secret has that key.
        key_dir, key_name = env["RERANK_API_KEY_FILE"].rsplit("/", 1)
        secret = next(
            d
            for d in objects
            if d["kind"] == "Secret" and d["metadata"]["name"] == mounts[key_dir]["secret"]["secretName"]
        )
        assert key_name in secret["stringData"]
        # Ports and probes agree with the app.
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["http"] == settings.server.port and settings.server.host == "0.0.0.0"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] in ports and get["path"] in paths, (probe, get)
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert container["resources"]["requests"] and container["resources"]["limits"]
        model_paths = {getattr(m, "path", "") for m in settings.models}
        assert all(p.startswith("/models/") for p in model_paths) and "/models" in mounts
        # Redis: the Service exists and serves the port the config names.
        redis = urlparse(settings.limits.redis_url)
        service = next(d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == redis.hostname)
        assert redis.port in [p["port"] for p in service["spec"]["ports"]]
        assert settings.limits.redis_failure == "open"  # an explicit choice, commented in the file
        # Every Service and PodDisruptionBudget selecting these pods exists.
        selected = [
            d
            for d in objects
            if d["kind"] in ("Service", "PodDisruptionBudget")
            and (d["spec"]["selector"].get("matchLabels", d["spec"]["selector"])).items() <= labels.items()
        ]
        assert {d["kind"] for d in selected} == {"Service", "PodDisruptionBudget"}
        if deployment["metadata"]["name"].endswith("-gpu"):
            # One worker per pod, one GPU per pod.
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert type(settings.models[0]).__struct_config__.tag == "packed"
    # Every Service selects some Deployment's pods.
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in objects if d["kind"] == "Deployment"]
    for service in (d for d in objects if d["kind"] == "Service"):
        assert any(service["spec"]["selector"].items() <= labels.items() for labels in pod_labels), service["metadata"]


def test_autoscaler_scales_the_gateway_on_metrics_it_exports() -> None:
    """The HPA targets the CPU Deployment, on per-pod gauges the app exports, through
    prometheus-adapter rules that serve exactly those names; its bounds agree with the PDB."""
    from prometheus_client.parser import text_string_to_metric_families

    objects = k8s_objects()
    (hpa,) = [d for d in objects if d["kind"] == "HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert ("Deployment", target["name"]) in {(d["kind"], d["metadata"]["name"]) for d in gateway_deployments()}
    with TestClient(create_app(Settings(models=(StaticEngineConfig(name="static"),)), configure_logs=False)) as c:
        exported = {f.name: f.type for f in text_string_to_metric_families(c.get("/metrics").text)}
    adapter = next(
        d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("prometheus-adapter")
    )
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    assert set(metrics) == {"rerank_in_flight_requests", "rerank_queued_requests"} == set(served)
    for name, target_value in metrics.items():
        assert exported.get(name) == "gauge", (name, exported.get(name))
        assert served[name]["seriesQuery"].startswith(name + "{") and re.fullmatch(
            served[name]["name"]["matches"], name
        )
        assert set(served[name]["resources"]["overrides"]) == {"namespace", "pod"}
        assert target_value["type"] == "AverageValue" and float(target_value["averageValue"]) > 0
    # The documented thresholds: 2 in flight (one running, one waiting) and 1 queued per pod.
    assert (
        metrics["rerank_in_flight_requests"]["averageValue"],
        metrics["rerank_queued_requests"]["averageValue"],
    ) == ("2", "1")
    (pdb,) = [d for d in objects if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == target["name"]]
    assert (
        hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
        and hpa["spec"]["maxReplicas"] >= hpa["spec"]["minReplicas"]
    )


# -- the key from the environment ------------------------------------------------------------
def test_env_key_becomes_a_keys_entry(tmp_path: Path) -> None:
    from gateway.security.auth import KeyStore, hash_key

    key = "rk-" + "x" * 30
    settings = load_settings(DEPLOY / "gateway.docker.toml", environ={"RERANK_API_KEY": key})
    (entry,) = settings.auth.keys
    assert (entry.id, entry.hash, entry.models) == ("env", hash_key(key), ("*",))
    assert KeyStore(settings.auth.keys).authenticate([(b"authorization", f"Bearer {key}".encode())]).id == "env"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    from_file = load_settings(None, environ={"RERANK_API_KEY_FILE": str(key_file), "RERANK_API_KEY_ID": "ops"})
    assert [(k.id, k.hash) for k in from_file.auth.keys] == [("ops", hash_key(key))]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RERANK_API_KEY": "short"}, "at least 16 characters"),
        ({"RERANK_API_KEY": "a key with spaces in it"}, "without spaces"),
        ({"RERANK_API_KEY": "k" * 20, "RERANK_API_KEY_FILE": "/x"}, "not both"),
        ({"RERANK_API_KEY_FILE": "/nonexistent/key"}, "cannot read /nonexistent/key"),
    ],
)
def test_env_key_mistakes_are_one_line_errors(environ: dict[str, str], message: str) -> None:
    from gateway.config.settings import ConfigError

    with pytest.raises(ConfigError, match=message) as info:
        load_settings(None, environ=environ)
    assert "\n" not in str(info.value) and "k" * 20 not in str(info.value)
