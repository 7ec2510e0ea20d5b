"""The Kubernetes manifests agree with the code: commands, settings, probes, ports, policy."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path, PurePosixPath
from unittest import mock

import pytest
import yaml
from waiting import wait_for

from gateway.cli import parser
from gateway.policy.load import load_policy, parse_policy
from gateway.settings import Settings, variables
from harness.gateways import free_port, run_gateway
from policies import fleet_policy

ROOT = Path(__file__).resolve().parents[2]

K8S = ROOT / "deploy/k8s"
SECRET_SETTINGS = {"DATABASE_URL", "GATEWAY_ADMIN_TOKEN", "REDIS_URL"}


def kustomization(folder: Path) -> dict:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def manifests(folder: Path) -> list[dict]:
    """Return every object the folder's kustomization lists, parsed."""
    objects = []
    for name in kustomization(folder)["resources"]:
        objects.extend(d for d in yaml.safe_load_all((folder / name).read_text()) if d)
    return objects


def one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def gateway_objects() -> list[dict]:
    return manifests(K8S)


@pytest.fixture(scope="module")
def deployment(gateway_objects: list[dict]) -> dict:
    return one(gateway_objects, "Deployment", "gateway")


@pytest.fixture(scope="module")
def container(deployment: dict) -> dict:
    (gateway,) = deployment["spec"]["template"]["spec"]["containers"]
    return gateway


def plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def settings_of(container: dict) -> Settings:
    """Return the settings the container's plain environment gives the gateway."""
    with mock.patch.dict(os.environ, plain_env(container), clear=True):
        return Settings()


def named_port(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def test_kustomizations_list_every_manifest_in_their_folder() -> None:
    for folder in (K8S, K8S / "simulators"):
        listed = set(kustomization(folder)["resources"])
        generated = {
            f for g in kustomization(folder).get("configMapGenerator", []) for f in g["files"]
        }
        present = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed | generated == present, folder
        for obj in manifests(folder):
            assert {"apiVersion", "kind", "metadata"} <= set(obj), obj
    kinds = {o["kind"] for o in manifests(K8S)}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "Job"} <= kinds


def test_gateway_runs_the_image_with_the_serve_command_on_its_port(container: dict) -> None:
    assert container["image"] == "shadow-gateway:latest"
    args = parser().parse_args(container["command"][1:])
    assert container["command"][0] == "gateway" and args.command == "serve"
    assert args.host == "0.0.0.0"
    assert args.port == named_port(container, "http") == Settings().port


def test_environment_names_only_real_settings_and_secrets_come_from_the_secret(
    gateway_objects: list[dict], container: dict
) -> None:
    (migrate,) = one(gateway_objects, "Job", "gateway-migrate")["spec"]["template"]["spec"][
        "containers"
    ]
    for env in (container["env"], migrate["env"]):
        names = {e["name"] for e in env}
        assert names <= set(variables()), names - set(variables())
    secret_refs = {}
    for entry in container["env"]:
        if entry["name"] in SECRET_SETTINGS:
            assert "value" not in entry, f"{entry['name']} is inlined"
            secret_refs[entry["name"]] = entry["valueFrom"]["secretKeyRef"]
    assert set(secret_refs) == SECRET_SETTINGS
    (database,) = migrate["env"]
    assert database["valueFrom"]["secretKeyRef"] == secret_refs["DATABASE_URL"]
    for value in plain_env(container).values():
        assert not re.search(r"://[^/@]*:[^/@]+@", value), f"a password is inlined: {value}"


def test_probes_ask_the_gateway_port_for_health_and_readiness(container: dict) -> None:
    probes = {k: container[k]["httpGet"] for k in container if k.endswith("Probe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    for probe in probes.values():
        assert named_port(container, probe["port"]) == named_port(container, "http")


def test_probe_and_metrics_paths_answer_on_a_ready_gateway(
    sims, tmp_path: Path, deployment: dict, container: dict
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    paths = {container[k]["httpGet"]["path"] for k in container if k.endswith("Probe")}
    paths.add(deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"])
    with run_gateway(policy, tmp_path) as gw, gw.http() as http:
        for path in paths:
            assert http.get(path).status_code == 200, path


def test_liveness_holds_while_readiness_fails_so_pods_are_not_restarted_for_their_backends(
    tmp_path: Path, container: dict
) -> None:
    dead = [f"http://127.0.0.1:{free_port()}"]
    with run_gateway(fleet_policy(dead, dead, dead), tmp_path) as gw, gw.http() as http:
        readiness = container["readinessProbe"]["httpGet"]["path"]
        wait_for(
            lambda: http.get(readiness).status_code != 200,
            message="the gateway stayed ready with no backend",
        )
        assert http.get(container["livenessProbe"]["httpGet"]["path"]).status_code == 200


def test_metrics_annotations_name_the_gateway_port(deployment: dict, container: dict) -> None:
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == named_port(container, "http")


def test_pods_get_past_the_drain_before_they_are_killed(deployment: dict, container: dict) -> None:
    pod = deployment["spec"]["template"]["spec"]
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and float(sleep[1]) > 0
    drain = settings_of(container).drain_timeout_s
    # SIGTERM comes after the preStop sleep; then requests drain and records are written.
    assert pod["terminationGracePeriodSeconds"] > float(sleep[1]) + drain


def test_the_policy_file_is_the_mounted_config_map_watched_for_edits(
    deployment: dict, container: dict
) -> None:
    settings = settings_of(container)
    pod = deployment["spec"]["template"]["spec"]
    (generator,) = kustomization(K8S)["configMapGenerator"]
    # A hashed name would restart the pods instead, and restarted pods ignore the file.
    assert generator["options"]["disableNameSuffixHash"] is True
    (volume,) = [
        v for v in pod["volumes"] if v.get("configMap", {}).get("name") == generator["name"]
    ]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert "subPath" not in mount, "a subPath mount never sees the ConfigMap change"
    path = PurePosixPath(str(settings.policy_path))
    assert path.parent == PurePosixPath(mount["mountPath"])
    assert path.name in generator["files"]
    assert settings.watch_policy


def test_what_the_gateway_writes_goes_to_a_writable_volume(
    deployment: dict, container: dict
) -> None:
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    pod = deployment["spec"]["template"]["spec"]
    scratch = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = [
        PurePosixPath(m["mountPath"])
        for m in container["volumeMounts"]
        if m["name"] in scratch and not m.get("readOnly")
    ]
    spill = settings_of(container).spill_dir
    assert spill is not None and spill.is_absolute()
    assert any(PurePosixPath(str(spill)).is_relative_to(w) for w in writable)


def test_policy_is_the_compose_fleet_on_the_simulator_pods() -> None:
    k8s = parse_policy((K8S / "policy.yaml").read_text(), "deploy/k8s/policy.yaml")
    compose = load_policy(ROOT / "policies/compose.yaml")
    assert k8s.routes == compose.routes
    assert k8s.slo_classes == compose.slo_classes
    sims = manifests(K8S / "simulators")
    for name, pool in k8s.pools.items():
        assert pool.model_dump(exclude={"backends"}) == compose.pools[name].model_dump(
            exclude={"backends"}
        )
        assert len(pool.backends) == len(compose.pools[name].backends)
        for backend in pool.backends:
            # http://POD.SERVICE:PORT, POD being STATEFULSET-ORDINAL
            found = re.match(r"http://([\w-]+)-(\d+)\.([\w-]+):(\d+)$", backend.url)
            assert found, f"{backend.url} is not a StatefulSet pod behind a headless Service"
            statefulset, ordinal, service, port = found.groups()
            headless = one(sims, "Service", service)
            assert headless["spec"]["clusterIP"] == "None"
            stateful = one(sims, "StatefulSet", statefulset)
            assert stateful["spec"]["serviceName"] == service
            assert int(ordinal) < stateful["spec"]["replicas"]
            labels = stateful["spec"]["template"]["metadata"]["labels"]
            assert headless["spec"]["selector"].items() <= labels.items()
            (sim,) = stateful["spec"]["template"]["spec"]["containers"]
            command = shlex.split(sim["command"][-1])
            assert command[command.index("--profile") + 1] == pool.kind
            assert command[command.index("--port") + 1] == port
            assert command[command.index("--host") + 1] == "0.0.0.0"
            engine = command[command.index("--engine") + 1] if "--engine" in command else None
            assert engine == pool.engine, f"{statefulset} publishes the load series of {engine}"
            (service_port,) = headless["spec"]["ports"]
            assert str(service_port["port"]) == port
            assert named_port(sim, service_port["targetPort"]) == int(port)


def test_service_and_disruption_budget_select_the_gateway_pods(
    gateway_objects: list[dict], deployment: dict, container: dict
) -> None:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(gateway_objects, "Service", "gateway")
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert named_port(container, port["targetPort"]) == port["port"] == Settings().port
    budget = one(gateway_objects, "PodDisruptionBudget", "gateway")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Nothing else may match: the Job's pods carry the same name, another component.
    for obj in gateway_objects:
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        if obj is not deployment and template:
            assert not service["spec"]["selector"].items() <= template["labels"].items()


def test_autoscaler_targets_the_deployment_on_cpu_it_requests(
    gateway_objects: list[dict], deployment: dict, container: dict
) -> None:
    hpa = one(gateway_objects, "HorizontalPodAutoscaler", "gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )
    assert "replicas" not in deployment["spec"], "apply would reset what the autoscaler chose"
    budget = one(gateway_objects, "PodDisruptionBudget", "gateway")
    assert hpa["spec"]["minReplicas"] > budget["spec"]["minAvailable"]
    resources = {m["resource"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Resource"}
    for resource in resources:
        assert resource in container["resources"]["requests"], (
            f"utilisation needs a {resource} request"
        )


def test_migration_job_upgrades_the_database(gateway_objects: list[dict]) -> None:
    job = one(gateway_objects, "Job", "gateway-migrate")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    (migrate,) = pod["containers"]
    assert migrate["image"] == "shadow-gateway:latest"
    args = parser().parse_args(migrate["command"][1:])
    assert (args.command, args.db_command, args.revision) == ("db", "upgrade", "head")
