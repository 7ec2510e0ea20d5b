"""Command line: `python -m simulator --profile gpu|asic|cim|PATH --port N [overrides…]`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from simulator.engines import ENGINES
from simulator.errors import ProfileError
from simulator.external import ExternalLoad
from simulator.faults import Faults
from simulator.kv_events import parse_config
from simulator.profile import apply_overrides, bundled_profiles, load_profile
from simulator.server import bind, run

# Flag destination → dotted path of the profile figure it overrides.
FIGURE_FLAGS = {
    "slots": "slots",
    "max_context": "max_context",
    "kv_cache_tokens": "kv_cache_tokens",
    "prefix_cache_tokens": "prefix_cache.capacity_tokens",
    "host_cache_tokens": "prefix_cache.host_tokens",
    "prefill_fixed_ms": "timing.prefill_fixed_ms",
    "prefill_per_token_us": "timing.prefill_per_token_us",
    "host_transfer_per_token_us": "timing.host_transfer_per_token_us",
    "decode_fixed_ms": "timing.decode_fixed_ms",
    "decode_per_seq_ms": "timing.decode_per_seq_ms",
    "max_batched_tokens": "timing.max_batched_tokens",
    "idle_w": "power.idle_w",
    "batch1_w": "power.batch1_w",
    "max_w": "power.max_w",
    "logit_noise": "precision.logit_noise",
    "drift": "precision.drift",
    "harmful_rate": "precision.harmful_rate",
    "embedding_noise": "precision.embedding_noise",
}


def build_parser() -> argparse.ArgumentParser:
    """Return the parser for the simulator's flags."""
    parser = argparse.ArgumentParser(
        prog="python -m simulator",
        description="Run one simulated inference backend (OpenAI-compatible) on one port.",
    )
    parser.add_argument(
        "--profile",
        default="gpu",
        help=f"bundled profile ({', '.join(bundled_profiles())}) or path to a profile YAML file",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9101, help="0 picks a free port")
    parser.add_argument("--devices", type=int, default=1, help="devices behind this port")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="divide every simulated duration by this"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of numeric noise, errors and sampling"
    )
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--api-key",
        help="require Authorization: Bearer KEY on every endpoint but /admin/*",
    )

    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="publish this serving engine's load series on /metrics, with its real names",
    )
    parser.add_argument(
        "--kv-events-config",
        help="publish the prefix caches' changes as vLLM does, e.g. "
        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558"}\'',
    )
    shared = parser.add_argument_group(
        "load of other clients (also settable at run time: POST /admin/external-load)"
    )
    shared.add_argument(
        "--external-load", type=int, default=0, help="requests other clients keep in flight"
    )
    shared.add_argument("--external-prompt-tokens", type=int, default=512)
    shared.add_argument("--external-output-tokens", type=int, default=256)

    figures = parser.add_argument_group("profile overrides")
    figures.add_argument("--slots", type=int)
    figures.add_argument("--models", help="comma-separated model names")
    figures.add_argument("--max-context", type=int)
    figures.add_argument("--kv-cache-tokens", type=int, help="KV cache of each device, tokens")
    figures.add_argument(
        "--prefix-cache-tokens", type=int, help="prompt prefixes each device keeps, tokens"
    )
    figures.add_argument(
        "--host-cache-tokens", type=int, help="prefixes its host memory keeps past that, tokens"
    )
    figures.add_argument(
        "--max-batched-tokens",
        type=int,
        help="tokens a step computes: one per sequence decoding, the rest in prompt chunks",
    )
    figures.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="keep no prompt prefixes: every prompt's prefill is computed in full",
    )
    for name in (
        "prefill-fixed-ms",
        "prefill-per-token-us",
        "host-transfer-per-token-us",
        "decode-fixed-ms",
        "decode-per-seq-ms",
        "idle-w",
        "batch1-w",
        "max-w",
        "logit-noise",
        "drift",
        "harmful-rate",
        "embedding-noise",
    ):
        figures.add_argument(f"--{name}", type=float)

    faults = parser.add_argument_group("faults (also settable at run time: POST /admin/faults)")
    faults.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 5xx")
    faults.add_argument("--added-latency-ms", type=float, default=0.0, help="wall-clock ms")
    faults.add_argument("--hang", action="store_true", help="accept requests, never answer")
    faults.add_argument("--refuse", action="store_true", help="close connections, no response")
    faults.add_argument("--drop-after-tokens", type=int, help="cut streams after N tokens")
    faults.add_argument("--slow-factor", type=float, default=1.0, help="multiply durations")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, start the simulator, and serve until SIGINT or SIGTERM."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.profile)
        overrides = {
            path: getattr(args, dest)
            for dest, path in FIGURE_FLAGS.items()
            if getattr(args, dest) is not None
        }
        if args.no_prefix_cache:
            overrides |= {"prefix_cache.capacity_tokens": 0, "prefix_cache.host_tokens": 0}
        kv_events = parse_config(args.kv_events_config) if args.kv_events_config else None
        models = [name.strip() for name in args.models.split(",")] if args.models else None
        profile = apply_overrides(profile, overrides, models)
        faults = Faults(
            error_rate=args.error_rate,
            added_latency_ms=args.added_latency_ms,
            hang=args.hang,
            refuse=args.refuse,
            drop_after_tokens=args.drop_after_tokens,
            slow_factor=args.slow_factor,
        )
    except ProfileError as exc:
        parser.error(str(exc))
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        parser.error(f"{flag} {error['input']} is not valid: {error['msg']}")
    try:
        external = ExternalLoad(
            requests=args.external_load,
            prompt_tokens=args.external_prompt_tokens,
            output_tokens=args.external_output_tokens,
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0])
        flag = "--external-" + ("load" if field == "requests" else field.replace("_", "-"))
        parser.error(f"{flag} {error['input']} is not valid: {error['msg']}")
    if args.devices < 1:
        parser.error(f"--devices must be at least 1, got {args.devices}")
    if not 0 < args.speed < float("inf"):
        parser.error(f"--speed must be a positive finite number, got {args.speed}")
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        parser.error(f"cannot listen on {args.host}:{args.port}: {exc.strerror}")

    def announce(url: str) -> None:
        print(f"simulator {profile.name} listening on {url}", flush=True)

    run(
        profile,
        sock,
        devices=args.devices,
        speed=args.speed,
        seed=args.seed,
        faults=faults,
        on_ready=announce,
        log_level=args.log_level,
        api_key=args.api_key,
        engine=args.engine,
        external_load=external,
        kv_events=kv_events,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
