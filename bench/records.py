"""A production week of records, written as the gateway writes them, to measure what reads them.

    python -m bench.records --requests 10000000 --shadows 2000000 --database URL [--week 2026-W48]

Writes into the database at URL (migrated first) a week of request records with their minutes
(request_minutes, folded as the record writer folds them), shadow records with their measures
and their minutes (shadow_minutes, folded as the shadow writer folds them and compacted as it
compacts them: the days settled a day before now into a row per day and key), shadow drops and
each backend's per-minute draw (backend_energy), in the tables and columns the gateway's writers
fill, derived from a policy (`--policy`, default policies/default.yaml): its routes, pools,
backends, models, SLO classes and shadow targets.

The traffic has the shapes a fleet's week has: a daily cycle (a peak in the UTC afternoon, a
trough at night, quieter weekends), Zipf-distributed tenants, log-normal prompt and answer
lengths within each route's match, streams and embeddings, a percent or two of errors (no
capacity, timeouts, clients that leave), latencies and energy from each pool kind's physics
(DESIGN.md's table) at the concurrency of the hour, and the cost model's predictions with their
error. Shadow copies answer closer to the primary on a GPU (noise floor) than on an ASIC, and
on an ASIC than on a CIM part. Everything is drawn from `--seed`, so a week is reproducible.

Rows go in as the writers send them: SQLite takes the writers' own INSERT statement in
batches (executemany), PostgreSQL takes COPY, into the week's day partitions. Decision ids are
a per-week prefix and a counter, as the gateway's are (gateway/ingress/api.py), so they rise
with time as the index likes.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from gateway.db import partitions
from gateway.db.connection import connect, upgrade
from gateway.db.schema import (
    backend_energy,
    request_minutes,
    request_records,
    shadow_drops,
    shadow_records,
)
from gateway.db.schema import shadow_minutes as shadow_minutes_table
from gateway.policy.definition import Policy, Route
from gateway.policy.load import load_policy
from gateway.promotion import shadow_minutes
from gateway.records.batching import Statement
from gateway.records.minutes import RECORD_COLUMNS, summarize, targets_of
from gateway.report.period import Period, last_complete_week, week

ROOT = Path(__file__).resolve().parent.parent
MINUTE_S = 60.0
WEEK_MINUTES = 7 * 24 * 60
TENANTS = 40
# Per pool kind: prefill (fixed s, s per prompt token) and decode step (s, s per extra sequence)
# for an 8B model (DESIGN.md), scaled by the model's size.
PHYSICS = {
    "gpu": (0.010, 32e-6, 0.0065, 0.14e-3),
    "asic": (0.005, 45e-6, 0.004, 0.25e-3),
    "cim": (0.020, 90e-6, 0.003, 0.6e-3),
}
# Shadow answers: the chance two answers are identical, by the candidate's kind (noise: GPU).
EXACT = {"gpu": 0.85, "asic": 0.7, "cim": 0.45}
CANDIDATE_ERRORS = {"gpu": 0.002, "asic": 0.01, "cim": 0.04}
# Downstream failures: status, error code, share of requests, whether a pool served it.
FAILURES = (
    (429, "no_capacity", 0.006, False),
    (503, "no_healthy_backend", 0.001, False),
    (502, "upstream_error", 0.002, True),
    (504, "upstream_timeout", 0.002, True),
    (499, "client_closed", 0.003, True),
)


@dataclass(frozen=True)
class Traffic:
    """What the week is drawn from: the policy's routes and the shares of each choice."""

    policy: Policy
    routes: list[Route]
    route_weights: np.ndarray
    tenants: list[str]
    tenant_weights: np.ndarray
    backends: list[tuple[str, str]]  # (pool, backend), indexed by backend number


def traffic(policy: Policy) -> Traffic:
    """Return the week's mix: embeddings a sixth of requests, chat routes in their order's
    decreasing shares, tenants Zipf-distributed."""
    routes = list(policy.routes)
    weights = []
    chat = [r for r in routes if not _embedding(policy, r)]
    for route in routes:
        if _embedding(policy, route):
            weights.append(1 / 6 / max(1, len(routes) - len(chat)))
        else:
            rank = chat.index(route)
            weights.append(5 / 6 * (1 / (rank + 1)) / sum(1 / (i + 1) for i in range(len(chat))))
    tenant_weights = 1 / np.arange(1, TENANTS + 1) ** 1.1
    backends = [(name, b.name) for name, spec in policy.pools.items() for b in spec.backends]
    return Traffic(
        policy,
        routes,
        np.array(weights) / sum(weights),
        [f"tenant-{i:02d}" for i in range(TENANTS)],
        tenant_weights / tenant_weights.sum(),
        backends,
    )


def _embedding(policy: Policy, route: Route) -> bool:
    models = route.match.models or []
    return bool(models) and all(
        (spec := policy.models.get(m)) is not None and spec.kind == "embedding" for m in models
    )


def load(minutes: int, rng: np.random.Generator, since: float) -> np.ndarray:
    """Return each minute's share of the week's traffic: a daily cycle peaking at 15:00 UTC
    at three times the night's, weekends at 60 %, and a little noise."""
    t = since + np.arange(minutes) * MINUTE_S
    hour = (t % 86400) / 3600
    daily = 0.5 + 0.5 * np.cos((hour - 15) / 24 * 2 * np.pi)
    weekday = ((t // 86400 + 3) % 7 < 5).astype(float)  # 1970-01-01 was a Thursday
    shape = (1 + 2 * daily) * (0.6 + 0.4 * weekday) * rng.lognormal(0, 0.1, minutes)
    return shape / shape.sum()


def _nullable(values: np.ndarray, known: np.ndarray) -> list[Any]:
    out = values.tolist()
    for i in np.flatnonzero(~known).tolist():
        out[i] = None
    return out


def _leading(n: int, first: float) -> np.ndarray:
    """Return shares of n choices: `first` for the first, the rest split evenly."""
    if n == 1:
        return np.ones(1)
    return np.array([first] + [(1 - first) / (n - 1)] * (n - 1))


def _pick(rng: np.random.Generator, options: Sequence[Any], n: int, p: Any = None) -> np.ndarray:
    return rng.choice(len(options), size=n, p=p)


class Week:
    """Draws the week's records hour by hour, in time order."""

    def __init__(self, traffic: Traffic, period: Period, requests: int, shadows: int, seed: int):
        self.t = traffic
        self.period = period
        self.rng = np.random.default_rng(seed)
        minutes = round((period.until - period.since) / MINUTE_S)
        self.shape = load(minutes, self.rng, period.since)
        self.per_minute = self.rng.multinomial(requests, self.shape)
        # The share of requests a shadow copy is taken of, among the eligible (answered chat on
        # a route that shadows something): enough for `shadows` copies over the week.
        eligible = sum(
            w for r, w in zip(traffic.routes, traffic.route_weights, strict=True) if r.shadow
        ) * (1 - sum(f[2] for f in FAILURES))
        self.shadow_share = min(1.0, shadows / max(1.0, requests * eligible))
        self.prefix = f"{seed:08x}{int(period.since) & 0xFFFFFFFF:08x}"
        self.counter = 0
        # Each backend's energy per minute, for backend_energy: attributed to requests here.
        self.draw = np.zeros((minutes, len(traffic.backends)))

    def hours(self) -> Iterator[tuple[dict[str, list[Any]], dict[str, list[Any]]]]:
        """Yield each hour's request and shadow columns."""
        for first in range(0, len(self.per_minute), 60):
            counts = self.per_minute[first : first + 60]
            if counts.sum():
                yield self._hour(first, counts)

    def _hour(
        self, first: int, counts: np.ndarray
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        rng, t, policy = self.rng, self.t, self.t.policy
        n = int(counts.sum())
        minute = np.repeat(np.arange(first, first + len(counts)), counts)
        ts = np.sort(self.period.since + minute * MINUTE_S + rng.random(n) * MINUTE_S)
        minute = ((ts - self.period.since) // MINUTE_S).astype(int)
        busy = self.shape[first : first + len(counts)].mean() * len(self.shape)  # 1: the mean

        route_i = _pick(rng, t.routes, n, t.route_weights)
        cols: dict[str, Any] = {c: [None] * n for c in _columns(request_records)}
        cols["decision_id"] = [f"{self.prefix}{self.counter + i:016x}" for i in range(n)]
        self.counter += n
        cols["ts"] = np.round(ts, 6).tolist()
        pool_names = list(policy.pools)
        pool_i = np.zeros(n, dtype=int)
        first_pool_i = np.zeros(n, dtype=int)
        fallback = rng.random(n) < 0.005
        model = np.empty(n, dtype=object)
        endpoint = np.empty(n, dtype=object)
        slo = np.empty(n, dtype=object)
        prompt = np.zeros(n)
        classes = list(policy.slo_classes)
        for k, route in enumerate(t.routes):
            at = np.flatnonzero(route_i == k)
            if not len(at):
                continue
            pools = route.pools
            chosen = np.array([pool_names.index(p) for p in pools])[
                rng.choice(len(pools), size=len(at), p=_leading(len(pools), 0.9))
            ]
            first_pool_i[at] = chosen
            backup = pool_names.index(route.fallback or pools[-1])
            pool_i[at] = np.where(fallback[at], backup, chosen)
            models = route.match.models or policy.pools[pools[0]].models
            model[at] = np.array(models, dtype=object)[rng.integers(0, len(models), len(at))]
            embedding = _embedding(policy, route)
            endpoint[at] = (
                "embeddings"
                if embedding
                else np.where(rng.random(len(at)) < 0.85, "chat", "completions")
            )
            allowed = route.match.slo_classes or classes
            slo[at] = np.array(allowed, dtype=object)[
                rng.choice(len(allowed), size=len(at), p=_leading(len(allowed), 0.8))
            ]
            if not route.match.slo_classes:  # no class asked: the default one applies
                slo[at[rng.random(len(at)) < 0.1]] = None
            low = route.match.prompt_tokens.min or 1
            high = route.match.prompt_tokens.max or min(policy.pools[p].max_context for p in pools)
            median = 60 if embedding else (350 if route.match.prompt_tokens.max else 2500)
            prompt[at] = np.clip(rng.lognormal(math.log(median), 1.0, len(at)), low, high)
        prompt = prompt.astype(int)
        embedding_rows = endpoint == "embeddings"
        stream = ~embedding_rows & (rng.random(n) < 0.6)
        completion = np.where(
            embedding_rows, 0, np.clip(rng.lognormal(math.log(180), 0.8, n), 1, 4096)
        ).astype(int)

        # Failures: some never reach a pool, the others end part way.
        status = np.full(n, 200)
        error = np.full(n, None, dtype=object)
        served = np.ones(n, dtype=bool)
        draw = rng.random(n)
        edge = 0.0
        for code, name, share, reached in FAILURES:
            hit = (draw >= edge) & (draw < edge + share)
            status[hit], error[hit] = code, name
            served[hit] = reached
            edge += share
        ok = status == 200

        kinds = np.array([policy.pools[p].kind for p in pool_names], dtype=object)[pool_i]
        slots = np.array([policy.pools[p].slots_per_backend for p in pool_names])[pool_i]
        concurrent = 1 + rng.binomial(slots - 1, np.clip(0.25 * busy, 0.02, 0.9))
        size = np.array([policy.params_b(m) for m in model]) / 8
        physics = np.array([PHYSICS.get(k, PHYSICS["gpu"]) for k in kinds])
        scale = size**0.7
        prefill = (physics[:, 0] + physics[:, 1] * prompt) * scale
        step = (physics[:, 2] + physics[:, 3] * (concurrent - 1)) * scale
        queue = np.where(rng.random(n) < 0.05, rng.exponential(0.05, n), rng.exponential(0.002, n))
        ttft = queue + prefill * rng.lognormal(0, 0.25, n)
        tpot = step * rng.lognormal(0, 0.15, n)
        shown = np.where(ok, completion, (completion * rng.random(n)).astype(int))
        e2e = np.where(embedding_rows, ttft, ttft + tpot * np.maximum(shown - 1, 0))
        e2e = np.where(served, e2e, rng.exponential(0.003, n))

        idle = np.array([policy.pools[p].power.idle_w for p in pool_names])[pool_i]
        peak = np.array([policy.pools[p].power.max_w for p in pool_names])[pool_i]
        watts = idle + (peak - idle) * np.sqrt(concurrent / slots)
        energy = watts * e2e / concurrent
        kwh_price = np.array([policy.pools[p].price.usd_per_kwh for p in pool_names])[pool_i]
        hour_price = np.array([policy.pools[p].price.usd_per_hour for p in pool_names])[pool_i]
        cost = energy / 3.6e6 * kwh_price + hour_price * e2e / 3600 / concurrent
        backend_i = np.zeros(n, dtype=int)
        for p, name in enumerate(pool_names):
            at = np.flatnonzero(pool_i == p)
            mine = [i for i, (pool, _) in enumerate(t.backends) if pool == name]
            backend_i[at] = np.array(mine)[rng.integers(0, len(mine), len(at))]
        np.add.at(self.draw, (minute[served], backend_i[served]), energy[served])

        tokens = served & ~(status == 499)
        cols["endpoint"] = endpoint.tolist()
        cols["route"] = [t.routes[k].name for k in route_i.tolist()]
        cols["pool"] = _nullable(np.array(pool_names, dtype=object)[pool_i], served)
        cols["backend"] = _nullable(
            np.array([b for _, b in t.backends], dtype=object)[backend_i], served
        )
        cols["model"] = model.tolist()
        cols["tenant"] = _nullable(
            np.array(t.tenants, dtype=object)[_pick(rng, t.tenants, n, t.tenant_weights)],
            rng.random(n) > 0.03,
        )
        cols["slo_class"] = slo.tolist()
        cols["stream"] = stream.tolist()
        cols["prompt_tokens"] = _nullable(prompt, tokens)
        cols["prompt_tokens_estimated"] = (
            np.maximum(1, prompt * rng.lognormal(0, 0.1, n)).astype(int).tolist()
        )
        cols["max_tokens"] = _nullable(np.full(n, 1024), ~embedding_rows & (rng.random(n) < 0.7))
        cols["completion_tokens"] = _nullable(shown, tokens)
        cols["queue_ms"] = _nullable(np.round(queue * 1000, 3), served)
        cols["ttft_ms"] = _nullable(np.round(ttft * 1000, 3), served & stream & (shown > 0))
        cols["tpot_ms"] = _nullable(np.round(tpot * 1000, 3), served & stream & (shown > 1))
        cols["e2e_ms"] = np.round(e2e * 1000, 3).tolist()
        cols["gateway_ms"] = np.round(rng.gamma(4, 0.1, n), 3).tolist()
        cols["attempts"] = np.where(fallback, 2, 1).tolist()
        cols["fallback"] = fallback.tolist()
        cols["status"] = status.tolist()
        cols["error"] = error.tolist()
        cols["energy_j"] = _nullable(np.round(energy, 6), served)
        cols["cost_usd"] = _nullable(cost, served)
        cols["energy_estimated"] = _nullable(np.zeros(n, dtype=bool), served)
        cols["concurrent"] = _nullable(concurrent, served)
        cols["context_tokens"] = _nullable((prompt + shown) * concurrent, served)
        cols["cached_tokens"] = _nullable(
            (prompt * rng.random(n) * (rng.random(n) < 0.4)).astype(int),
            served & ~embedding_rows,
        )
        predicted = served & (rng.random(n) < 0.98)
        cols["predicted_ttft_ms"] = _nullable(
            np.round(ttft * 1000 * rng.lognormal(0.05, 0.2, n), 3), predicted
        )
        cols["predicted_e2e_ms"] = _nullable(
            np.round(e2e * 1000 * rng.lognormal(0.05, 0.2, n), 3), predicted
        )
        cols["predicted_energy_j"] = _nullable(energy * rng.lognormal(0.05, 0.25, n), predicted)
        cols["first_pool"] = _nullable(np.array(pool_names, dtype=object)[first_pool_i], served)

        copied = ok & ~embedding_rows & (rng.random(n) < self.shadow_share)
        copied &= np.array([bool(t.routes[k].shadow) for k in route_i.tolist()])
        shadows = self._shadows(
            np.flatnonzero(copied), cols, route_i, kinds, backend_i, ttft, tpot, e2e
        )
        return cols, shadows

    def _shadows(
        self,
        at: np.ndarray,
        req: dict[str, Any],
        route_i: np.ndarray,
        kinds: np.ndarray,
        backend_i: np.ndarray,
        ttft: np.ndarray,
        tpot: np.ndarray,
        e2e: np.ndarray,
    ) -> dict[str, list[Any]]:
        rng, t, policy = self.rng, self.t, self.t.policy
        n = len(at)
        cols: dict[str, Any] = {c: [None] * n for c in _columns(shadow_records)}
        pick = at.tolist()
        for name in ("decision_id", "ts", "route", "model", "tenant", "endpoint", "stream"):
            cols[name] = [req[name][i] for i in pick]
        cols["primary_pool"] = [req["pool"][i] for i in pick]
        cols["primary_backend"] = [req["backend"][i] for i in pick]
        candidate, candidate_backend, kind, candidate_kind = [], [], [], []
        for i in pick:
            route = t.routes[route_i[i]]
            noise = route.noise
            if noise is not None and rng.random() < noise.share / (1 + noise.share):
                pool = req["pool"][i]
                others = [b.name for b in policy.pools[pool].backends]
                kind.append("noise")
                candidate_kind.append("gpu")
            else:
                target = route.shadow[int(rng.integers(0, len(route.shadow)))]
                pool = target.pool
                others = [b.name for b in policy.pools[pool].backends]
                kind.append("candidate")
                candidate_kind.append(policy.pools[pool].kind)
            candidate.append(pool)
            candidate_backend.append(others[int(rng.integers(0, len(others)))])
        cols["kind"] = kind
        cols["candidate_pool"] = candidate
        cols["candidate_backend"] = candidate_backend
        sampled = rng.random(n) < 0.3
        cols["temperature"] = np.where(sampled, 0.7, 0.0).tolist()
        cols["sampled"] = sampled.tolist()
        cols["seeded"] = [False] * n
        cols["primary_status"] = [200] * n
        failed = rng.random(n) < np.array([CANDIDATE_ERRORS.get(k, 0.01) for k in candidate_kind])
        cols["candidate_status"] = _nullable(np.full(n, 200), ~failed)
        cols["candidate_error"] = ["upstream_timeout" if f else None for f in failed.tolist()]
        answered = ~failed
        speed = np.array(
            [{"gpu": 1.0, "asic": 0.8, "cim": 1.6}.get(k, 1.0) for k in candidate_kind]
        )
        for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            primary = req[f"{name}_ms"] if name != "e2e" else req["e2e_ms"]
            cols[f"primary_{name}_ms"] = [primary[i] for i in pick]
            known = np.array([primary[i] is not None for i in pick], dtype=bool)
            mine = np.round(values[at] * 1000 * speed * rng.lognormal(0, 0.2, n), 3)
            cols[f"candidate_{name}_ms"] = _nullable(mine, answered & known)
        prompts = [req["prompt_tokens"][i] for i in pick]
        completions = np.array([req["completion_tokens"][i] for i in pick], dtype=float)
        cols["primary_prompt_tokens"] = prompts
        cols["primary_completion_tokens"] = completions.astype(int).tolist()
        cols["candidate_prompt_tokens"] = _nullable(np.array(prompts, dtype=object), answered)
        exact = rng.random(n) < np.array([EXACT.get(k, 0.6) for k in candidate_kind])
        ratio = np.where(exact, 1.0, rng.lognormal(0, 0.15, n))
        cols["candidate_completion_tokens"] = _nullable(
            np.maximum(1, completions * ratio).astype(int), answered
        )
        differs = answered & ~exact
        cols["exact_match"] = _nullable(exact, answered)
        cols["normalized_match"] = _nullable(exact | (rng.random(n) < 0.1), answered)
        cols["similarity"] = _nullable(
            np.where(exact, 1.0, np.round(rng.beta(6, 2, n), 6)), answered
        )
        cols["similarity_method"] = _nullable(np.full(n, "rouge_l", dtype=object), answered)
        words = np.maximum(1, completions * 0.75).astype(int)
        cols["reference_words"] = _nullable(words, answered)
        cols["first_divergence"] = _nullable((words * rng.random(n)).astype(int), differs)
        cols["length_ratio"] = _nullable(np.round(ratio, 6), answered)
        cols["token_divergence"] = _nullable((completions * rng.random(n)).astype(int), differs)
        cols["near_tie"] = _nullable(rng.random(n) < 0.6, differs)
        cols["kl_divergence"] = _nullable(np.round(rng.gamma(2, 0.02, n), 6), answered)
        cols["semantic_similarity"] = _nullable(np.round(rng.beta(30, 2, n), 6), differs)
        primary_energy = np.array([req["energy_j"][i] for i in pick], dtype=float)
        primary_cost = np.array([req["cost_usd"][i] for i in pick], dtype=float)
        cols["primary_energy_j"] = primary_energy.tolist()
        cols["primary_cost_usd"] = primary_cost.tolist()
        efficiency = np.array(
            [{"gpu": 1.0, "asic": 0.3, "cim": 0.15}.get(k, 1) for k in candidate_kind]
        )
        cols["candidate_energy_j"] = _nullable(
            np.round(primary_energy * efficiency * rng.lognormal(0, 0.2, n), 6), answered
        )
        cols["candidate_cost_usd"] = _nullable(
            primary_cost * efficiency * rng.lognormal(0, 0.2, n), answered
        )
        del backend_i, kinds  # the candidate's backend is drawn above
        return cols

    def drops(self) -> dict[str, list[Any]]:
        """Each hour's shadow copies dropped by budget, per route and candidate."""
        rows: dict[str, list[Any]] = {c: [] for c in _columns(shadow_drops)}
        hours = len(self.per_minute) // 60
        for route in self.t.routes:
            for target in route.shadow:
                counts = self.rng.poisson(3 * self.shape.reshape(hours, 60).sum(1) * hours)
                for h in np.flatnonzero(counts).tolist():
                    for name, value in (
                        ("ts", self.period.since + h * 3600),
                        ("route", route.name),
                        ("candidate_pool", target.pool),
                        ("kind", "candidate"),
                        ("reason", "budget"),
                        ("count", int(counts[h])),
                    ):
                        rows[name].append(value)
        return rows

    def backend_minutes(self) -> dict[str, list[Any]]:
        """Each backend's minute: on all of it, its idle draw plus its requests' energy."""
        policy = self.t.policy
        minutes, backends = self.draw.shape
        idle = np.array([policy.pools[pool].power.idle_w for pool, _ in self.t.backends])
        energy = self.draw + idle * MINUTE_S
        return {
            "ts": np.repeat(self.period.since + np.arange(minutes) * MINUTE_S, backends).tolist(),
            "pool": [pool for pool, _ in self.t.backends] * minutes,
            "backend": [b for _, b in self.t.backends] * minutes,
            "on_s": [MINUTE_S] * (minutes * backends),
            "parked_s": [0.0] * (minutes * backends),
            "energy_j": np.round(energy.reshape(-1), 3).tolist(),
            "estimated_j": [0.0] * (minutes * backends),
        }


def _columns(table: sa.Table) -> tuple[str, ...]:
    generated = table.autoincrement_column
    return tuple(c.name for c in table.columns if c is not generated)


Writer = Callable[[sa.Table, dict[str, list[Any]]], int]


def writer(db: sa.Engine) -> Writer:
    """Return a function that writes columns of rows into a table as the gateway's writers do:
    their INSERT statement in batches on SQLite, COPY on PostgreSQL."""
    raw = db.raw_connection()
    postgres = db.dialect.name == "postgresql"

    def write(table: sa.Table, cols: dict[str, list[Any]]) -> int:
        names = _columns(table)
        rows = list(zip(*(cols[c] for c in names), strict=True))
        cursor = raw.cursor()
        if postgres:
            with cursor.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            statement = Statement.insert(table, db)
            assert statement.columns == names
            cursor.executemany(statement.sql, rows)
        raw.commit()
        return len(rows)

    return write


def generate(
    url: str, requests: int, shadows: int, period: Period, policy: Policy, seed: int = 0
) -> dict[str, Any]:
    """Write a week of records into the database at url; return what was written and how fast."""
    upgrade(url)
    db = connect(url)
    if db.dialect.name == "postgresql":  # the week's days, as the gateway made them ahead
        with db.begin() as conn:
            for table in partitions.PARTITIONED:
                partitions.make_days(conn, table, period.since, period.until - 1)
    write = writer(db)
    week_ = Week(traffic(policy), period, requests, shadows, seed)
    started = time.perf_counter()
    written = {"request_records": 0, "shadow_records": 0}
    written["request_minutes"] = written["shadow_minutes"] = 0
    targets = targets_of(policy)
    for requests_cols, shadow_cols in week_.hours():
        written["request_records"] += write(request_records, requests_cols)
        written["shadow_records"] += write(shadow_records, shadow_cols)
        # The minutes the record writer folds as requests end, written beside them (an hour's
        # minutes are whole: every request of the hour is in it).
        records = (
            dict(zip(RECORD_COLUMNS, values, strict=True))
            for values in zip(*(requests_cols[c] for c in RECORD_COLUMNS), strict=True)
        )
        minutes = [m.row() for m in summarize(records, targets)]
        written["request_minutes"] += write(
            request_minutes, {c: [m[c] for m in minutes] for c in _columns(request_minutes)}
        )
        # And the shadow minutes the shadow writer folds as copies are recorded, each judged
        # against its request's SLO class, as its compaction leaves them once the hour settled.
        classes = dict(zip(requests_cols["decision_id"], requests_cols["slo_class"], strict=True))
        copies = (
            dict(zip(shadow_cols, values, strict=True))
            for values in zip(*shadow_cols.values(), strict=True)
        )
        copied = [m.row() for m in shadow_minutes.summarize(
            ({**c, "slo_class": classes.get(c["decision_id"])} for c in copies),
            targets,
            shadow_minutes.HOUR_S,
        )]  # fmt: skip
        written["shadow_minutes"] += write(
            shadow_minutes_table,
            {c: [m[c] for m in copied] for c in _columns(shadow_minutes_table)},
        )
    written["shadow_drops"] = write(shadow_drops, week_.drops())
    written["backend_energy"] = write(backend_energy, week_.backend_minutes())
    # The shadow writer's compaction folds each day a day after it ends into a row per key.
    shadow_minutes.compact(db, time.time())
    with db.connect() as conn:
        written["shadow_minutes_compacted"] = conn.execute(
            sa.select(sa.func.count()).select_from(shadow_minutes_table)
        ).scalar_one()
    db.dispose()
    return {"week": period.label, **written, "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.records", description=__doc__)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--shadows", type=int, default=200_000)
    parser.add_argument("--database", required=True, help="database URL, migrated first")
    parser.add_argument("--week", help="ISO week like 2026-W48 (default: the last complete one)")
    parser.add_argument("--policy", default=str(ROOT / "policies" / "default.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    period = week(args.week) if args.week else last_complete_week(time.time())
    result = generate(
        args.database, args.requests, args.shadows, period, load_policy(args.policy), args.seed
    )
    print(result, file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
