"""The gateway's settings: one typed object, read once from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Process configuration; defaults run on a laptop with SQLite and in-memory state."""

    # Each field is read from GATEWAY_ and its name in capitals, unless its alias says otherwise.
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", extra="ignore", frozen=True, populate_by_name=True
    )

    database_url: str = Field(
        default="sqlite:///gateway.db", validation_alias=AliasChoices("DATABASE_URL")
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("REDIS_URL"),
        description="Shared state for several replicas; unset: one process, in memory.",
    )
    redis_prefix: str = Field(
        default="gateway",
        min_length=1,
        description="Prefix of every Redis key and channel: one per fleet of replicas.",
    )
    redis_timeout_s: float = Field(
        default=0.5,
        gt=0,
        description="A Redis call slower than this counts as Redis unreachable.",
    )
    slot_lease_s: float = Field(
        default=10.0,
        gt=0,
        description="How long the slots of a replica that died stay taken in Redis.",
    )
    upstream_hosts: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Hosts (host, host:port, *.domain) every backend and metrics URL of a "
        "policy must be on, comma-separated; empty: any.",
    )
    parking_commands: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Programs a pool's parking hook (hook: command) may run, as its commands "
        "name them, comma-separated; empty: none, so a policy runs nothing on this host.",
    )
    upstream_key_hosts: dict[str, list[str]] = Field(
        default={},
        description="JSON: the hosts each upstream key may be sent to, e.g. "
        '{"GATEWAY_UPSTREAM_KEY_VLLM": ["*.vllm.internal"]}; a key not listed is sent nowhere '
        '(["*"]: any host).',
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for /admin; unset disables the admin API.",
    )
    policy_path: Path = Field(
        default=Path("policies/default.yaml"), validation_alias=AliasChoices("GATEWAY_POLICY")
    )
    host: str = Field(default="127.0.0.1")
    port: int = Field(default=8080)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    log_level: str = Field(default="info")
    health_check_interval_s: float = Field(default=2.0, gt=0)
    routing_seed: int | None = Field(
        default=None,
        description="Seed of the draw that puts a request in a canary's share or explores; "
        "unset: random. Set, a replica given the same requests in order routes them alike.",
    )
    power_scrape_interval_s: float = Field(default=1.0, gt=0)
    model_retrain_every: int = Field(default=200, gt=0)
    model_retrain_interval_s: float = Field(default=300.0, gt=0)
    model_retrain_min_interval_s: float = Field(
        default=10.0,
        ge=0,
    )
    report_schedule: str = Field(
        default="",
        description="Weekday and UTC time of the weekly report, e.g. 'mon 06:00'; empty: off.",
    )
    reports_dir: Path = Field(default=Path("reports"))
    watch_policy: bool = Field(
        default=False,
        description="Apply the policy file whenever it is saved (gateway serve --watch).",
    )
    rollout_check_interval_s: float = Field(default=30.0, gt=0)
    policy_poll_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often a replica checks the database for a new active policy version.",
    )
    record_flush_interval_s: float = Field(default=0.5, gt=0)
    record_buffer_rows: int = Field(
        default=10_000,
        ge=0,
        description="Rows per table held in memory while the database is unreachable.",
    )
    spill_dir: Path | None = Field(
        default=Path("spill"),
        description="Where rows beyond the memory buffer are spilled (JSON lines); empty: off.",
    )
    spill_max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Size limit of each table's spill file; past it, records are dropped.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="On SIGTERM, how long in-flight requests may take to finish before closing.",
    )
    max_answer_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest answer body read from a backend (primary, shadow copy, probe).",
    )
    max_connections: int = Field(
        default=4096,
        gt=0,
        description="Client connections open at once; past it, a new one gets 503 and is closed.",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        gt=0,
        description="Largest request line and headers; a larger head gets 431.",
    )
    client_write_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A client that reads nothing of its answer this long is disconnected.",
    )
    docs: bool = Field(
        default=False,
        description="Serve /docs, whose page loads its scripts from a public CDN; off by default "
        "since operators paste the admin token on this origin.",
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a client may take to send a request body before a 408.",
    )

    retention_days: float = Field(
        default=30.0,
        ge=0,
        description="Days request records and cost models are kept; 0 keeps them forever.",
    )
    shadow_retention_days: float = Field(
        default=30.0,
        ge=0,
        description="Days shadow records and shadow drop counts are kept; 0 keeps them forever.",
    )
    retention_interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="How often `gateway serve` deletes records past retention; 0: never.",
    )

    @field_validator("redis_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("upstream_hosts", "parking_commands", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [host.strip() for host in value.split(",") if host.strip()]
        return value

    @field_validator("spill_dir", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        return None if value == "" else value


def variables() -> list[str]:
    """Return the environment variable each setting is read from, in declaration order."""
    prefix = Settings.model_config.get("env_prefix", "")
    names = []
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        names.append(
            str(alias.choices[0]) if isinstance(alias, AliasChoices) else (prefix + name).upper()
        )
    return names
