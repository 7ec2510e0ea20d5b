"""The gateway's settings: one typed object, read once from the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Process configuration; defaults run on a laptop with SQLite and in-memory state."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    database_url: str = Field(
        default="sqlite:///gateway.db.engine", validation_alias=AliasChoices("DATABASE_URL")
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("REDIS_URL"),
        description="Shared state for several replicas; unset: one process, in memory.",
    )
    redis_prefix: str = Field(
        default="gateway",
        min_length=1,
        validation_alias=AliasChoices("GATEWAY_REDIS_PREFIX"),
        description="Prefix of every Redis key and channel: one per fleet of replicas.",
    )
    redis_timeout_s: float = Field(
        default=0.5,
        gt=0,
        validation_alias=AliasChoices("GATEWAY_REDIS_TIMEOUT_S"),
        description="A Redis call slower than this counts as Redis unreachable.",
    )
    slot_lease_s: float = Field(
        default=10.0,
        gt=0,
        validation_alias=AliasChoices("GATEWAY_SLOT_LEASE_S"),
        description="How long the slots of a replica that died stay taken in Redis.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("GATEWAY_ADMIN_TOKEN"),
        description="Bearer token for /admin; unset disables the admin API.",
    )
    policy_path: Path = Field(
        default=Path("policies/default.yaml"), validation_alias=AliasChoices("GATEWAY_POLICY")
    )
    host: str = Field(default="127.0.0.1", validation_alias=AliasChoices("GATEWAY_HOST"))
    port: int = Field(default=8080, validation_alias=AliasChoices("GATEWAY_PORT"))
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, validation_alias=AliasChoices("GATEWAY_MAX_BODY_BYTES")
    )
    log_level: str = Field(default="info", validation_alias=AliasChoices("GATEWAY_LOG_LEVEL"))
    health_check_interval_s: float = Field(
        default=2.0, gt=0, validation_alias=AliasChoices("GATEWAY_HEALTH_CHECK_INTERVAL_S")
    )
    power_scrape_interval_s: float = Field(
        default=1.0, gt=0, validation_alias=AliasChoices("GATEWAY_POWER_SCRAPE_INTERVAL_S")
    )
    model_retrain_every: int = Field(
        default=200, gt=0, validation_alias=AliasChoices("GATEWAY_MODEL_RETRAIN_EVERY")
    )
    model_retrain_interval_s: float = Field(
        default=300.0, gt=0, validation_alias=AliasChoices("GATEWAY_MODEL_RETRAIN_INTERVAL_S")
    )
    model_retrain_min_interval_s: float = Field(
        default=10.0,
        ge=0,
        validation_alias=AliasChoices("GATEWAY_MODEL_RETRAIN_MIN_INTERVAL_S"),
    )
    report_schedule: str = Field(
        default="",
        validation_alias=AliasChoices("GATEWAY_REPORT_SCHEDULE"),
        description="Weekday and UTC time of the weekly report, e.g. 'mon 06:00'; empty: off.",
    )
    reports_dir: Path = Field(
        default=Path("reports"), validation_alias=AliasChoices("GATEWAY_REPORTS_DIR")
    )
    watch_policy: bool = Field(
        default=False,
        validation_alias=AliasChoices("GATEWAY_WATCH_POLICY"),
        description="Apply the policy file whenever it is saved (gateway serve --watch).",
    )
    rollout_check_interval_s: float = Field(
        default=30.0, gt=0, validation_alias=AliasChoices("GATEWAY_ROLLOUT_CHECK_INTERVAL_S")
    )
    policy_poll_interval_s: float = Field(
        default=2.0,
        gt=0,
        validation_alias=AliasChoices("GATEWAY_POLICY_POLL_INTERVAL_S"),
        description="How often a replica checks the database for a new active policy version.",
    )
    record_flush_interval_s: float = Field(
        default=0.5, gt=0, validation_alias=AliasChoices("GATEWAY_RECORD_FLUSH_INTERVAL_S")
    )
    record_buffer_rows: int = Field(
        default=10_000,
        ge=0,
        validation_alias=AliasChoices("GATEWAY_RECORD_BUFFER_ROWS"),
        description="Rows per table held in memory while the database is unreachable.",
    )
    spill_dir: Path | None = Field(
        default=Path("spill"),
        validation_alias=AliasChoices("GATEWAY_SPILL_DIR"),
        description="Where rows beyond the memory buffer are spilled (JSON lines); empty: off.",
    )
    spill_max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        validation_alias=AliasChoices("GATEWAY_SPILL_MAX_BYTES"),
        description="Size limit of each table's spill file; past it, records are dropped.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices("GATEWAY_DRAIN_TIMEOUT_S"),
        description="On SIGTERM, how long in-flight requests may take to finish before closing.",
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices("GATEWAY_BODY_READ_TIMEOUT_S"),
        description="How long a client may take to send a request body before a 408.",
    )

    retention_days: float = Field(
        default=30.0,
        ge=0,
        validation_alias=AliasChoices("GATEWAY_RETENTION_DAYS"),
        description="Days request records and cost models are kept; 0 keeps them forever.",
    )
    shadow_retention_days: float = Field(
        default=30.0,
        ge=0,
        validation_alias=AliasChoices("GATEWAY_SHADOW_RETENTION_DAYS"),
        description="Days shadow records and shadow drop counts are kept; 0 keeps them forever.",
    )
    retention_interval_s: float = Field(
        default=3600.0,
        ge=0,
        validation_alias=AliasChoices("GATEWAY_RETENTION_INTERVAL_S"),
        description="How often `gateway serve` deletes records past retention; 0: never.",
    )

    @field_validator("redis_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("spill_dir", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        return None if value == "" else value
