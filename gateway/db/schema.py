"""The database schema: every table the gateway keeps, in one place, as the migrations build it.

Rows are written by their owners (request and shadow records, policy versions, cost models,
promotion verdicts, rollouts, precision checks) and read by the judge, the reports and the admin
API; retention deletes the old ones. `gateway/db/migrations/` creates exactly these tables: a
test compares the two.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# Integer keys: 64-bit where rows are many, SQLite's own INTEGER (its rowid) there.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

policy_versions = sa.Table(
    "policy_versions",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("content", sa.Text, nullable=False, comment="The policy YAML, as applied."),
    sa.Column("hash", sa.String(64), nullable=False, comment="SHA-256 of content."),
    sa.Column("author", sa.String(128), nullable=False),
    sa.Column("created", sa.Float, nullable=False, comment="Unix seconds."),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("restores", sa.Integer, comment="For a rollback: the version whose content it is."),
)


active_policy = sa.Table(
    "active_policy",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False, comment="Always 1."),
    sa.Column("version", sa.Integer, sa.ForeignKey("policy_versions.version"), nullable=False),
    sa.Column("updated", sa.Float, nullable=False, comment="Unix seconds."),
    sa.CheckConstraint("id = 1", name="ck_active_policy_one_row"),
)


request_records = sa.Table(
    "request_records",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("decision_id", sa.String(32), nullable=False, unique=True),
    sa.Column("ts", sa.Float, nullable=False, index=True, comment="Arrival, Unix seconds."),
    sa.Column("endpoint", sa.String(16), nullable=False),
    sa.Column("route", sa.String(64)),
    sa.Column("pool", sa.String(64)),
    sa.Column("backend", sa.String(64)),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(64)),
    sa.Column("slo_class", sa.String(32)),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("prompt_tokens_estimated", sa.Integer),
    sa.Column("max_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("queue_ms", sa.Float),
    sa.Column("ttft_ms", sa.Float),
    sa.Column("tpot_ms", sa.Float),
    sa.Column("e2e_ms", sa.Float),
    sa.Column("gateway_ms", sa.Float),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("fallback", sa.Boolean, nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("error", sa.String(64)),
    sa.Column("energy_j", sa.Float, comment="Measured energy attributed to the request."),
    sa.Column("cost_usd", sa.Float, comment="Energy price plus the device time it held."),
    sa.Column(
        "energy_estimated",
        sa.Boolean,
        comment="True when the pool reported no power and energy_j is from nominal figures.",
    ),
    sa.Column("concurrent", sa.Integer, comment="Requests on the backend, this one included."),
    sa.Column(
        "context_tokens",
        sa.Integer,
        comment="KV-cache tokens its backend held at admission (every replica's), its own in.",
    ),
    sa.Column("predicted_ttft_ms", sa.Float),
    sa.Column("predicted_e2e_ms", sa.Float),
    sa.Column("predicted_energy_j", sa.Float),
    sa.Column("first_pool", sa.String(64), comment="The pool tried first, before any fallback."),
    # The rollout guards' read of a canary's requests (migration 0007 says which query).
    sa.Index("ix_request_records_route_first_pool_ts", "route", "first_pool", "ts"),
)


shadow_records = sa.Table(
    "shadow_records",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("decision_id", sa.String(32), nullable=False, index=True),
    sa.Column(
        "ts", sa.Float, nullable=False, index=True, comment="Primary's arrival, Unix seconds."
    ),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(64)),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("endpoint", sa.String(16), nullable=False),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("temperature", sa.Float),
    sa.Column("top_p", sa.Float),
    sa.Column("seeded", sa.Boolean, nullable=False),
    sa.Column("sampled", sa.Boolean, nullable=False),
    sa.Column("primary_pool", sa.String(64), nullable=False),
    sa.Column("primary_backend", sa.String(64)),
    sa.Column("candidate_pool", sa.String(64), nullable=False),
    sa.Column("candidate_backend", sa.String(64)),
    sa.Column("primary_status", sa.Integer, nullable=False),
    sa.Column("candidate_status", sa.Integer),
    sa.Column("candidate_error", sa.String(64)),
    sa.Column("primary_ttft_ms", sa.Float),
    sa.Column("primary_tpot_ms", sa.Float),
    sa.Column("primary_e2e_ms", sa.Float),
    sa.Column("candidate_ttft_ms", sa.Float),
    sa.Column("candidate_tpot_ms", sa.Float),
    sa.Column("candidate_e2e_ms", sa.Float),
    sa.Column("primary_prompt_tokens", sa.Integer),
    sa.Column("primary_completion_tokens", sa.Integer),
    sa.Column("candidate_prompt_tokens", sa.Integer),
    sa.Column("candidate_completion_tokens", sa.Integer),
    sa.Column("exact_match", sa.Boolean),
    sa.Column("normalized_match", sa.Boolean),
    sa.Column("similarity", sa.Float),
    sa.Column("similarity_method", sa.String(16)),
    sa.Column("first_divergence", sa.Integer),
    sa.Column("length_ratio", sa.Float),
    sa.Column("json_diff", sa.Text),
    sa.Column("embedding_cosine", sa.Float),
    sa.Column("token_divergence", sa.Integer, comment="First token that differs (logprobs)."),
    sa.Column("near_tie", sa.Boolean, comment="The candidate's token there is a primary top-k."),
    sa.Column("kl_divergence", sa.Float, comment="Mean KL from top-k logprobs, in nats."),
    sa.Column("semantic_similarity", sa.Float, comment="Cosine of the answers' embeddings."),
    sa.Column("measures", sa.Text),
    sa.Column("primary_energy_j", sa.Float),
    sa.Column("candidate_energy_j", sa.Float),
    sa.Column("primary_cost_usd", sa.Float),
    sa.Column("candidate_cost_usd", sa.Float),
    sa.Column("primary_text", sa.Text),
    sa.Column("candidate_text", sa.Text),
    sa.Column(
        "text_expires_at",
        sa.Float,
        index=True,
        comment="When the stored texts are erased, Unix seconds.",
    ),
    # The judge, the summary and the rollout guards read one route's time range (migration 0007).
    sa.Index("ix_shadow_records_route_ts", "route", "ts"),
)


shadow_drops = sa.Table(
    "shadow_drops",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column(
        "ts", sa.Float, nullable=False, index=True, comment="Start of the minute, Unix seconds."
    ),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate_pool", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Index("ix_shadow_drops_route_ts", "route", "ts"),
)


cost_models = sa.Table(
    "cost_models",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("created", sa.Float, nullable=False, comment="Unix seconds."),
    sa.Column("observations", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False, comment="ok, or failed"),
    sa.Column("error", sa.Text, comment="Why training failed."),
    sa.Column("scores", sa.Text, comment="JSON: pool → model → target → {observations, mape}."),
    sa.Column("residuals", sa.Text, comment="JSON: the learned weights and bounds."),
)


promotion_evaluations = sa.Table(
    "promotion_evaluations",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("ts", sa.Float, nullable=False, index=True, comment="Unix seconds."),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate", sa.String(64), nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False, comment="promote, hold or reject"),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("evidence", sa.Text, nullable=False, comment="JSON: every check with its numbers."),
)


rollouts = sa.Table(
    "rollouts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate", sa.String(64), nullable=False),
    sa.Column("former_primary", sa.String(64), nullable=False),
    sa.Column("state", sa.String(16), nullable=False, comment="rolling, complete, rolled_back"),
    sa.Column("step", sa.Integer, nullable=False, comment="Index into rollout_steps; -1: none."),
    sa.Column("weight", sa.Float, nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("step_started", sa.Float, nullable=False),
    sa.Column("history", sa.Text, nullable=False, comment="JSON list of {ts, event, weight}."),
)


precision_checks = sa.Table(
    "precision_checks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("ts", sa.Float, nullable=False, comment="Unix seconds."),
    sa.Column("pool", sa.String(64), nullable=False, comment="The candidate pool checked."),
    sa.Column("reference", sa.String(64), nullable=False),
    sa.Column("suite", sa.Text, nullable=False, comment="The suite file, as named."),
    sa.Column("verdict", sa.String(16), nullable=False, comment="pass or fail"),
    sa.Column("result", sa.Text, nullable=False, comment="JSON: the check's figures and reasons."),
    sa.Index("ix_precision_checks_pool_ts", "pool", "ts"),
)
