"""The CPU images built from ``deploy/Dockerfile`` and run for real with podman (issue 23 item 1).

No registry is reachable from CI, so the base is made from Debian's packages: ``mmdebstrap``
writes a Debian 12 root file system with Python 3.11 and ``redis-server``, imported as an image,
plus a venv on PATH (a stand-in for ``python:3.11-slim``). The project's own Dockerfile then
builds the cloud-only image (``EXTRAS=``) and the ``transformers`` image, whose torch comes from
a PEP 503 index of the CPU wheel and its dependencies served on loopback (PyTorch's index is not
reachable either). Both are built once per session with ``--format docker`` (OCI drops
``HEALTHCHECK``); the base stays in podman's storage, so a second session skips mmdebstrap.

Each image is started with a key file, a mounted config and (transformers) the tiny checkpoint,
and checked: keyless start refused in one line (exit 2), ``/health``, ``/ready``, scores equal
to the same request on the host, 401 without the key, SIGHUP key reload, SIGTERM with requests
in flight (all answered, exit 0), the image's HEALTHCHECK, the unprivileged user, the image
size. A ``redis-server`` image from the same Debian packages holds the per-key limit two
gateway containers share. The GPU image and Kubernetes are only validated (tests/test_deploy.py).

podman and mmdebstrap are installed with apt-get when missing (root; the README's test command
says so); the module is skipped, saying why, only when that is impossible. Every image it made
is removed at the end unless ``RERANK_KEEP_IMAGES=1`` (then the next run skips mmdebstrap and
reuses the layers). Recipe and sandbox settings: docs/containers.md.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.config.settings import load_settings
from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.slow

PACKAGES = ["podman", "runc", "mmdebstrap", "uidmap", "slirp4netns", "fuse-overlayfs"]
BOOKWORM = "localhost/rerank-ci-bookworm:latest"
PYBASE = "localhost/rerank-ci-pybase:3.11"
REDIS = "localhost/rerank-ci-redis:latest"
IMAGES = {"cloud": "localhost/rerank-ci-gateway:cloud", "transformers": "localhost/rerank-ci-gateway:transformers"}
# Sizes seen when this test was written (cloud 345 MB, transformers 1,471 MB on a Debian base
# holding Python and redis-server): a bound with room, so a dependency that balloons shows up.
MAX_SIZE_MB = {"cloud": 500, "transformers": 2200}
KEY, NEW_KEY = "rk-image-test-key-0123456789abcdef", "rk-image-test-rotated-0123456789ab"
DOCS = ["Paris is the capital of France.", "Berlin is in Germany.", "The capital of France is Paris."]
# crun refuses this machine's hybrid cgroups and the sandbox forbids raising rlimits.
CONTAINERS_CONF = '[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n[containers]\ndefault_ulimits = []\n'


class Podman:
    def __init__(self, conf: Path) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        run = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and run.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])} ...: exit {run.returncode}\n{run.stderr[-3000:]}")
        return run

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def image_id(self, image: str) -> str | None:
        run = self("image", "inspect", "--format", "{{.Id}}", image, check=False)
        return run.stdout.strip() if run.returncode == 0 else None

    def build_replacing(self, image: str, *args: str, timeout: float = 1200) -> None:
        """Build ``image``, then delete the image the tag pointed at before, if it changed.

        A rebuild moves the tag and leaves the old image behind untagged: 1.8 GB per suite run,
        which filled this machine's disk (CI died in pip with ENOSPC) after a day of runs.
        """
        old = self.image_id(image)
        self("build", *args, "-t", image, timeout=timeout)
        if old and old != self.image_id(image):
            # check=False: a container of another run may still use it; then it stays.
            self("rmi", old, check=False)


def _install() -> str | None:
    """Install podman and mmdebstrap; the reason they cannot be, or None."""
    if shutil.which("podman") and shutil.which("mmdebstrap"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "podman is not installed and cannot be: apt-get as root is needed"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        if run.returncode != 0:
            return f"podman cannot be installed: {' '.join(cmd)}: {run.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def private_tmp() -> Iterator[Path]:
    """Not pytest's base temp: concurrent pytest sessions on one machine prune old ones, and a
    config, an index or a mount source that vanishes mid-build fails obscurely."""
    path = Path(tempfile.mkdtemp(prefix="rerank-images-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _remove_images(pm: Podman) -> None:
    """Every image this module made (about 2.5 GB), unless RERANK_KEEP_IMAGES=1 asks to keep them
    for the next run (which then skips mmdebstrap and reuses the build cache)."""
    if os.environ.get("RERANK_KEEP_IMAGES", "").strip() in ("1", "true", "yes"):
        return
    for image in (*IMAGES.values(), REDIS, PYBASE, BOOKWORM):
        pm("rmi", "--force", image, check=False, timeout=300)


@pytest.fixture(scope="module")
def podman(private_tmp: Path) -> Iterator[Podman]:
    reason = _install()
    if reason:
        pytest.skip(reason)
    work = private_tmp / "podman"
    work.mkdir()
    (work / "containers.conf").write_text(CONTAINERS_CONF)
    pm = Podman(work / "containers.conf")
    if not pm.exists(PYBASE):
        if not pm.exists(BOOKWORM):
            tar = work / "bookworm.tar"
            subprocess.run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--include=python3,python3-venv,ca-certificates,redis-server",
                    "bookworm",
                    str(tar),
                ],
                check=True,
                capture_output=True,
                timeout=900,
            )
            pm("import", str(tar), BOOKWORM)
            tar.unlink()
        # This machine's CA bundle, so pip inside the build reaches the index as the host does.
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", work / "ca.crt")
        (work / "Containerfile").write_text(
            f"FROM {BOOKWORM}\nCOPY ca.crt /etc/ssl/certs/ca-certificates.crt\n"
            "RUN python3 -m venv /opt/py && ln -sf /opt/py/bin/python /usr/local/bin/python "
            "&& ln -sf /opt/py/bin/pip /usr/local/bin/pip\n"
            "ENV PATH=/opt/py/bin:$PATH PIP_CERT=/etc/ssl/certs/ca-certificates.crt\n"
        )
        pm("build", "--network", "host", "-t", PYBASE, str(work))
    try:
        yield pm
    finally:
        _remove_images(pm)


@pytest.fixture(scope="module")
def torch_index(private_tmp: Path) -> Iterator[str]:
    """A PEP 503 index of this machine's CPU torch wheel and its dependencies, on loopback."""
    import torch

    wheels = private_tmp / "wheels"
    version = torch.__version__
    subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "pip"),
            "download",
            "--quiet",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            f"torch=={version}",
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    root = wheels / "simple"
    for whl in wheels.glob("*.whl"):
        project = root / re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
        project.mkdir(parents=True, exist_ok=True)
        os.link(whl, project / whl.name)
    # A fixed port when free: the URL is a build argument, and a new one each session would
    # defeat the build cache of the layers after it.
    port = INDEX_PORT if _port_free(INDEX_PORT) else free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=wheels,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}/simple"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def images(podman: Podman, torch_index: str) -> dict[str, str]:
    """Both CPU images, built from the working tree once per session, side by side (each waits
    on the network or the disk for much of its build)."""

    def build(kind: str, extras: str) -> float:
        start = time.monotonic()
        index = ["--build-arg", f"TORCH_INDEX={torch_index}"] if extras else []
        podman.build_replacing(
            IMAGES[kind],
            "--network",
            "host",
            "--format",
            "docker",
            "--build-arg",
            f"BASE={PYBASE}",
            "--build-arg",
            f"EXTRAS={extras}",
            *index,
            "-f",
            str(ROOT / "deploy" / "Dockerfile"),
            str(ROOT),
        )
        return round(time.monotonic() - start, 1)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {
            kind: pool.submit(build, kind, extras) for kind, extras in (("cloud", ""), ("transformers", "transformers"))
        }
        times = {kind: future.result() for kind, future in futures.items()}
    print(f"image build seconds: {times}")
    return IMAGES


INDEX_PORT = 47653


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _readable(path: Path) -> Path:
    """Container user 10001 must read mounted files: pytest's tmp dirs are 0700."""
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path


def _config(kind: str, model_path: str) -> str:
    models = '[[models]]\nname = "static"\nengine = "static"\nscores = {"Berlin is in Germany." = 0.1}\n\n'
    models += '[[models]]\nname = "slow"\nengine = "static"\ndelay_s = 2.0\n'
    if kind == "transformers":
        models = (
            f'[[models]]\nname = "tiny"\nengine = "transformers"\npath = "{model_path}"\n'
            'dtype = "float32"\nmax_length = 160\nmax_query_tokens = 32\n\n'
        ) + models
    return f'[server]\nhost = "0.0.0.0"\nport = 8000\nshutdown_timeout_s = 20\n\n[logging]\nformat = "json"\n\n{models}'


class Container:
    def __init__(self, podman: Podman, image: str, name: str, *args: str) -> None:
        self.podman, self.name = podman, name
        podman("rm", "-f", name, check=False)
        podman("run", "-d", "--name", name, *args, image)

    def stop(self) -> None:
        self.podman("rm", "-f", self.name, check=False)


@pytest.fixture(scope="module", params=["cloud", "transformers"])
def running(request, podman: Podman, images: dict[str, str], tiny_qwen3_dir: Path, private_tmp: Path):
    kind = request.param
    # Not under pytest's base temp: concurrent pytest sessions on one machine prune old ones,
    # and a mount whose source vanished shows the container an empty folder.
    work = private_tmp / kind
    work.mkdir()
    model = work / "tiny"
    shutil.copytree(tiny_qwen3_dir, model)
    (work / "gateway.toml").write_text(_config(kind, "/models/tiny"))
    (work / "key").write_text(KEY + "\n")
    _readable(work)
    port = free_port()
    box = Container(
        podman,
        images[kind],
        f"rerank-ci-{kind}",
        "-p",
        f"127.0.0.1:{port}:8000",
        "-e",
        "RERANK_API_KEY_FILE=/run/secrets/key",
        "-v",
        f"{work / 'key'}:/run/secrets/key:ro",
        "-v",
        f"{work / 'gateway.toml'}:/etc/rerank-gateway/gateway.toml:ro",
        "-v",
        f"{model}:/models/tiny:ro",
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            ready = httpx.get(f"{url}/ready", timeout=2)
            if ready.status_code == 200:
                break
            failed = any(m["state"] == "failed" for m in ready.json()["models"])
        except httpx.HTTPError:
            failed = False
        if failed or time.monotonic() > deadline:
            ready = httpx.get(f"{url}/ready", timeout=5).text if _answers(url) else "no answer"
            box.stop()
            raise AssertionError(f"{kind} container not ready in 180 s: {ready[-2000:]}")
        time.sleep(0.5)
    host_config = work / "host.toml"
    host_config.write_text(_config(kind, str(model)))
    yield kind, url, box, work, load_settings(host_config, environ={})
    box.stop()


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.HTTPError:
        return False
    return True


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keyless_start_is_refused_in_one_line(podman: Podman, images: dict[str, str]) -> None:
    for kind, image in images.items():
        run = podman("run", "--rm", "--no-healthcheck", image, check=False, timeout=120)
        assert run.returncode == 2, (kind, run.stdout[-500:], run.stderr[-500:])
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "RERANK_API_KEY" in lines[0], (kind, lines)


def test_image_runs_unprivileged_with_its_healthcheck_and_size(podman: Podman, running) -> None:
    kind, _, box, _, _ = running
    assert podman("exec", box.name, "id", "-u").stdout.strip() == "10001"
    assert podman("exec", box.name, "id", "-un").stdout.strip() == "gateway"
    health = podman("healthcheck", "run", box.name, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    size_mb = int(podman("image", "inspect", IMAGES[kind], "--format", "{{.Size}}").stdout) / 1e6
    print(f"image {kind}: {size_mb:.0f} MB")
    assert size_mb < MAX_SIZE_MB[kind], f"{kind} image is {size_mb:.0f} MB"


def test_health_ready_401_and_scores_equal_to_the_host(running) -> None:
    kind, url, _, _, settings = running
    assert httpx.get(f"{url}/health", timeout=5).json() == {"status": "ok"}
    ready = httpx.get(f"{url}/ready", timeout=5).json()
    assert ready["status"] == "ready" and all(m["state"] == "ready" for m in ready["models"])
    body = {"model": "tiny" if kind == "transformers" else "static", "query": "capital of France?", "documents": DOCS}
    assert httpx.post(f"{url}/v2/rerank", json=body, timeout=30).status_code == 401
    assert (
        httpx.post(
            f"{url}/v2/rerank", json=body, headers=_auth("rk-wrong-key-0123456789abcdef"), timeout=30
        ).status_code
        == 401
    )
    answer = httpx.post(f"{url}/v2/rerank", json=body, headers=_auth(), timeout=60)
    assert answer.status_code == 200, answer.text
    with TestClient(create_app(settings, configure_logs=False)) as host:
        deadline = time.monotonic() + 120
        while host.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        expected = host.post("/v2/rerank", json=body, headers=_auth())
    assert expected.status_code == 200, expected.text
    got = [(r["index"], r["relevance_score"]) for r in answer.json()["results"]]
    want = [(r["index"], r["relevance_score"]) for r in expected.json()["results"]]
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_sighup_reloads_the_key_file(podman: Podman, running) -> None:
    _, url, box, work, _ = running
    body = {"model": "static", "query": "q", "documents": ["a"]}
    (work / "key").write_text(NEW_KEY + "\n")  # same inode: the bind mount sees it
    try:
        podman("kill", "--signal", "HUP", box.name)
        deadline = time.monotonic() + 30
        while httpx.post(f"{url}/v2/rerank", json=body, headers=_auth(NEW_KEY), timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the new key was not loaded"
            time.sleep(0.2)
        assert httpx.post(f"{url}/v2/rerank", json=body, headers=_auth(), timeout=10).status_code == 401
    finally:
        (work / "key").write_text(KEY + "\n")
        podman("kill", "--signal", "HUP", box.name)
    deadline = time.monotonic() + 30
    while httpx.post(f"{url}/v2/rerank", json=body, headers=_auth(), timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the first key was not restored"
        time.sleep(0.2)


def test_sigterm_drains_requests_in_flight_then_exits_0(podman: Podman, running) -> None:
    # Last test of each image: it stops the container.
    _, url, box, _, _ = running
    body = {"model": "slow", "query": "q", "documents": ["a", "b"]}

    def one(_: int) -> int:
        return httpx.post(f"{url}/v2/rerank", json=body, headers=_auth(), timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(4)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            models = httpx.get(f"{url}/ready", timeout=5).json()["models"]
            if sum(m.get("in_flight", 0) for m in models) >= 4:
                break
            time.sleep(0.05)
        start = time.monotonic()
        stop = podman("stop", "-t", "30", box.name)  # SIGTERM, SIGKILL after 30 s
        took = time.monotonic() - start
        statuses = [f.result() for f in futures]
    assert statuses == [200] * 4
    code = podman("inspect", box.name, "--format", "{{.State.ExitCode}}").stdout.strip()
    assert code == "0" and took < 25, (code, took, stop.stderr)


@pytest.fixture(scope="module")
def redis_image(podman: Podman) -> str:
    if not podman.exists(REDIS):
        with tempfile.TemporaryDirectory() as ctx:
            # The Debian base already holds redis-server (installed by mmdebstrap from Debian's packages).
            Path(ctx, "Containerfile").write_text(
                f'FROM {BOOKWORM}\nUSER redis\nEXPOSE 6379\nCMD ["redis-server", "--bind", "0.0.0.0", '
                '"--protected-mode", "no", "--save", "", "--appendonly", "no"]\n'
            )
            podman("build", "--format", "docker", "-t", REDIS, ctx)
    return REDIS


def test_two_gateway_containers_share_the_redis_limit(
    podman: Podman, images: dict[str, str], redis_image: str, private_tmp: Path
) -> None:
    # Both gateways join the Redis container's network namespace (as in a pod): Redis on
    # 127.0.0.1:6379 for both, gateway A on 8000 and B on 8001, published from that namespace.
    ports = free_port(), free_port()
    tmp_path = private_tmp / "redis"
    tmp_path.mkdir()
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[server]\nhost = "0.0.0.0"\nport = 8000\n\n[limits]\nredis_url = "redis://127.0.0.1:6379/0"\n\n'
        f'[[auth.keys]]\nid = "shared"\nhash = "{_hash(KEY)}"\nmodels = ["*"]\nrpm = 4\n\n'
        '[[models]]\nname = "static"\nengine = "static"\n'
    )
    _readable(tmp_path)
    redis = Container(
        podman, redis_image, "rerank-ci-redis", "-p", f"127.0.0.1:{ports[0]}:8000", "-p", f"127.0.0.1:{ports[1]}:8001"
    )
    boxes = []
    try:
        for n, inner in enumerate((8000, 8001)):
            boxes.append(
                Container(
                    podman,
                    images["cloud"],
                    f"rerank-ci-replica-{n}",
                    "--network",
                    "container:rerank-ci-redis",
                    "-e",
                    f"RERANK_SERVER__PORT={inner}",
                    "-v",
                    f"{config}:/etc/rerank-gateway/gateway.toml:ro",
                )
            )
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, podman("logs", boxes[-1].name, check=False).stderr[-2000:]
                time.sleep(0.3)
        body = {"model": "static", "query": "q", "documents": ["a"]}
        # rpm = 4 for the key across both replicas: 2 + 2 pass, the fifth (on either) is refused.
        statuses = [
            httpx.post(f"{urls[i % 2]}/v2/rerank", json=body, headers=_auth(), timeout=10).status_code for i in range(5)
        ]
        assert statuses == [200, 200, 200, 200, 429], statuses
        assert json.loads(httpx.get(f"{urls[1]}/ready", timeout=5).text)["status"] == "ready"
    finally:
        for box in boxes:
            box.stop()
        redis.stop()


def _hash(key: str) -> str:
    from gateway.security.auth import hash_key

    return hash_key(key)


class _Recorder:
    """Stands in for :class:`Podman` to see what the module's cleanup asks podman to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> None:
        self.calls.append(args)


def test_cleanup_removes_every_image_unless_asked_to_keep_them(monkeypatch: pytest.MonkeyPatch) -> None:
    pm = _Recorder()
    monkeypatch.delenv("RERANK_KEEP_IMAGES", raising=False)
    _remove_images(pm)  # type: ignore[arg-type]
    removed = [c[-1] for c in pm.calls if c[:2] == ("rmi", "--force")]
    assert removed == [*IMAGES.values(), REDIS, PYBASE, BOOKWORM]  # children before the bases they are built on
    pm.calls.clear()
    monkeypatch.setenv("RERANK_KEEP_IMAGES", "1")
    _remove_images(pm)  # type: ignore[arg-type]
    assert pm.calls == []
