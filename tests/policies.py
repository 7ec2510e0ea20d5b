"""Small policies for tests, built as YAML so they go through the real loader."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.policy.credentials import Access
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy, to_yaml

MODEL = "llama-3.1-8b-instruct"
BIG = "llama-3.1-70b-instruct"
EMBED = "bge-large-en-v1.5"
# The keys the keyed simulators require (conftest.py), by the variable tests give them in.
UPSTREAM_KEYS = {
    "GATEWAY_UPSTREAM_KEY_GPU": "sk-upstream-gpu-7f3a9c",
    "GATEWAY_UPSTREAM_KEY_ASIC": "sk-upstream-asic-51be02",
    "GATEWAY_UPSTREAM_KEY_CIM": "sk-upstream-cim-c48d1e",
}


def pool(kind: str, urls: Sequence[str], models: Sequence[str], **extra: object) -> dict:
    """Return a pool entry with plausible nominal figures."""
    entry = {
        "kind": kind,
        "backends": [{"url": u} for u in urls],
        "models": list(models),
        "max_context": {"gpu": 131072, "asic": 8192, "cim": 4096}.get(kind, 8192),
        # An H200's: the models, 8B each as the policy gives no sizes, fit with half of it for KV.
        "memory_gb": 141,
        "slots_per_backend": {"gpu": 32, "asic": 16, "cim": 4}.get(kind, 8),
        "compute_tflops": 989,
        "bandwidth_gbs": 3350,
        "power": {"idle_w": 100, "max_w": 700},
        "price": {"usd_per_hour": 2.5, "usd_per_kwh": 0.12},
    }
    entry.update(extra)
    return entry


def ranked_route(explore: float) -> dict:
    """A chat route ranking the GPU and the ASIC by energy, exploring `explore` of requests."""
    return {
        "name": "chat",
        "match": {"models": [MODEL]},
        "pools": ["gpu", "asic"],
        "fallback": "gpu",
        "objective": "min_energy",
        "explore": explore,
    }


def fleet_policy(
    gpu: Sequence[str] = ("http://127.0.0.1:1",),
    asic: Sequence[str] = ("http://127.0.0.1:2",),
    cim: Sequence[str] = ("http://127.0.0.1:3",),
    *,
    gpu_extra: dict | None = None,
    asic_extra: dict | None = None,
    cim_extra: dict | None = None,
    interactive: dict | None = None,
    routes: list[dict] | None = None,
    **top: object,
) -> Policy:
    """Return the default fleet's shape (8B on all kinds, 70B on GPU, embeddings) for tests."""
    doc = {
        "default_slo_class": "interactive",
        "slo_classes": {
            "interactive": {"ttft_ms": 500, "tpot_ms": 50, "max_queue_ms": 200, "timeout_s": 5}
            | (interactive or {}),
            "batch": {"e2e_ms": 60000, "max_queue_ms": 5000, "timeout_s": 60},
        },
        "pools": {
            "gpu": pool("gpu", gpu, [MODEL, BIG, EMBED], **(gpu_extra or {})),
            "asic": pool("asic", asic, [MODEL, EMBED], **(asic_extra or {})),
            "cim": pool("cim", cim, [MODEL], **({"live": False} | (cim_extra or {}))),
        },
        "routes": routes
        or [
            {
                "name": "chat-8b-short",
                "match": {
                    "models": [MODEL],
                    "prompt_tokens": {"max": 2048},
                    "slo_classes": ["interactive"],
                },
                "pools": ["asic", "gpu"],
                "fallback": "gpu",
            },
            {
                "name": "chat-8b",
                "match": {"models": [MODEL]},
                "pools": ["gpu", "asic"],
                "fallback": "gpu",
            },
            {"name": "chat-70b", "match": {"models": [BIG]}, "pools": ["gpu"]},
            {
                "name": "embeddings",
                "match": {"models": [EMBED]},
                "pools": ["asic", "gpu"],
                "fallback": "gpu",
            },
        ],
    }
    doc.update(top)
    return parse_policy(to_yaml(doc), "test-policy.yaml")


def keyed(policy: Policy, variables: dict[str, str], **backend: object) -> Policy:
    """Return the policy with each listed pool's backends taking their key from a variable."""
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    for name, variable in variables.items():
        for entry in doc["pools"][name]["backends"]:
            entry.update({"api_key_env": variable, **backend})
    return parse_policy(to_yaml(doc), "keyed.yaml")


# Where the tests' upstream keys may be sent (GATEWAY_UPSTREAM_KEY_HOSTS): every backend they
# reach is on loopback.
LOOPBACK_KEY_HOSTS = {variable: ["127.0.0.1"] for variable in UPSTREAM_KEYS}


def loopback_access(environ: dict[str, str]) -> Access:
    """Return a gateway's upstream access holding these keys, each bound to loopback."""
    return Access(environ, key_hosts={variable: ["127.0.0.1"] for variable in environ})
