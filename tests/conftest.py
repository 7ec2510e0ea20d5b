"""Test world: each test gets a clean environment; helpers start real servers on loopback."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.settings import variables

TESTS = Path(__file__).resolve().parent

GATEWAY_ENV = variables()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's gateway settings out of every test."""
    for name in GATEWAY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    for name in ("OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo_root() -> Path:
    return TESTS.parent


def pytest_report_header() -> str:
    return f"gateway tests: python {sys.version.split()[0]}, CI={os.environ.get('CI', '')}"


@dataclass
class SimFleet:
    """Simulator processes standing in for the default policy's pools (gpu_70b for `gpu-70b`)."""

    gpu: list
    asic: list
    cim: list
    gpu_70b: list = field(default_factory=list)

    def all(self) -> list:
        return [*self.gpu, *self.asic, *self.cim, *self.gpu_70b]

    def urls(self, pool: str) -> list[str]:
        return [s.url for s in getattr(self, pool.replace("-", "_"))]


# The shared fleet decodes without numeric noise, so that end-to-end tests may compare two
# answers to one prompt; precision is tested with the profiles' noise where it is the subject
# (tests/simulator, tests/promotion, tests/shadow's own simulators). Harmful errors stay.
EXACT = ["--logit-noise", "0"]


@pytest.fixture(scope="session")
def sim_processes() -> Iterator[SimFleet]:
    from harness.simulators import start_simulator

    with contextlib.ExitStack() as stack:
        fleet = SimFleet(
            gpu=[
                stack.enter_context(start_simulator("gpu", seed=s, extra_args=EXACT))
                for s in (1, 2)
            ],
            asic=[stack.enter_context(start_simulator("asic", seed=3, extra_args=EXACT))],
            cim=[stack.enter_context(start_simulator("cim", seed=4, extra_args=EXACT))],
            gpu_70b=[
                stack.enter_context(
                    start_simulator(
                        "gpu", seed=5, extra_args=[*EXACT, "--models", "llama-3.1-70b-instruct"]
                    )
                )
            ],
        )
        yield fleet


@pytest.fixture(scope="session")
def keyed_sim_processes() -> Iterator[SimFleet]:
    """One simulator per pool kind that answers only requests carrying its pool's key."""
    from harness.simulators import start_simulator
    from policies import UPSTREAM_KEYS

    with contextlib.ExitStack() as stack:
        yield SimFleet(
            *(
                [stack.enter_context(start_simulator(kind, seed=5, api_key=key))]
                for kind, key in zip(("gpu", "asic", "cim"), UPSTREAM_KEYS.values(), strict=True)
            )
        )


@pytest.fixture
def keyed_sims(keyed_sim_processes: SimFleet) -> Iterator[SimFleet]:
    """The keyed simulators, with every fault cleared after the test."""
    yield keyed_sim_processes
    for sim in keyed_sim_processes.all():
        sim.reset_faults()


@pytest.fixture
def sims(sim_processes: SimFleet) -> Iterator[SimFleet]:
    """The shared simulators, with every fault cleared after the test."""
    yield sim_processes
    for sim in sim_processes.all():
        sim.reset_faults()


def postgres_url() -> str:
    """Return the test PostgreSQL URL; skip (or, in CI, fail) when it cannot be reached."""
    import sqlalchemy as sa

    url = os.environ.get(
        "GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    try:
        db = sa.create_engine(url, connect_args={"connect_timeout": 2})
        with db.connect():
            pass
        db.dispose()
    except sa.exc.OperationalError as exc:
        _unreachable("PostgreSQL", url, exc)
    return url


@pytest.fixture
def postgres_server() -> str:
    """Return the test PostgreSQL URL, for a test that makes its own schema; skip without it."""
    return postgres_url()


def _unreachable(service: str, url: str, exc: Exception) -> None:
    """Skip a test whose server is missing, except in CI, where that fails it."""
    if os.environ.get("GATEWAY_TEST_REQUIRE_SERVICES"):
        pytest.fail(f"{service} is required here and unreachable at {url}: {exc}")
    variable = "GATEWAY_TEST_REDIS_URL" if service == "Redis" else "GATEWAY_TEST_POSTGRES_URL"
    pytest.skip(f"no {service} at {url} (set {variable})")


@pytest.fixture
def redis_url() -> str:
    """Return the test Redis URL; skip (or, in CI, fail) when it cannot be reached."""
    import redis

    url = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unreachable("Redis", url, exc)
    finally:
        client.close()
    return url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis; its keys are deleted after."""
    import uuid

    import redis

    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[object]:
    """A Redis server of this test's own, which it may stop and start."""
    import shutil

    from redisproc import start_redis

    if shutil.which("redis-server") is None:
        _unreachable("Redis", "redis-server", FileNotFoundError("redis-server is not installed"))
    with start_redis(tmp_path) as server:
        yield server


DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database of each kind (SQLite, PostgreSQL), migrated to the newest schema."""
    from harness.databases import scratch_database

    base = postgres_url() if request.param == "postgresql" else None
    with scratch_database(base, tmp_path) as url:
        yield url


@pytest.fixture(scope="module", params=DATABASES)
def module_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A database of each kind shared by a module's tests, for tests that only read what the
    module stored in it (a constructed week is worth building once)."""
    from harness.databases import scratch_database

    base = postgres_url() if request.param == "postgresql" else None
    with scratch_database(base, tmp_path_factory.mktemp("database")) as url:
        yield url
