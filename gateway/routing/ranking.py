"""Rank a route's eligible pools with the cost model: cheapest that meets the SLO first.

For each pool the cost model predicts the request's latency (with a p90 upper bound), energy and
cost given the pool's current load. Pools whose bound misses the request's SLO drop out; the rest
are ordered by the route's objective. When no pool is predicted to meet the SLO, the fastest
leads and the decision says so. A pure function of its inputs, like the router it plugs into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.costmodel.predict import CostModel, OutputLengths, Prediction
from gateway.fleet.state import BackendState, PoolState
from gateway.policy.definition import Route
from gateway.policy.tariffs import Rates
from gateway.routing.classify import RequestProfile

OBJECTIVES: dict[str, Callable[[Prediction], float]] = {
    "min_cost": lambda p: p.marginal_cost_usd,
    "min_energy": lambda p: p.marginal_energy_j,
    "min_carbon": lambda p: p.marginal_carbon_g,
    "min_latency": lambda p: p.e2e_s,
}


@dataclass(slots=True)
class Ranking:
    """Pools in the order to try, with each one's prediction."""

    pools: list[PoolState]
    predictions: dict[str, Prediction] = field(default_factory=dict)
    slo_unmeetable: bool = False
    # Pools predicted to miss the SLO while others meet it, cheapest first: left out of
    # `pools`, but a route's `explore` share may still try them, since a pool predicted slow
    # is seen again only if something is sent there.
    dropped: list[PoolState] = field(default_factory=list)
    # The first pool is full, and predicted to meet the SLO once its queue lets the request
    # in, still the cheapest: wait there rather than take a dearer pool's free slot.
    wait_for_first: bool = False
    # Per pool, the backends to try in order, where the ranking chose them itself (a ranking
    # by backend: the routing benchmark's baselines and oracle; the cost ranking, the backend
    # it predicted on); a pool it leaves out gets the backend its `most_free` picks.
    backends: dict[str, list[BackendState]] = field(default_factory=dict)
    # The KV-cache bytes `backends` were chosen to have room for, when the ranking chose them
    # for the request's share as its cost model's policy books it: the router takes them only
    # when its own policy books the same (a request that read the policy before a reload ranks
    # on the new version's cost model), else it searches the pool itself. None: for any.
    kv_bytes: float | None = None


def preference_order(
    profile: RequestProfile,
    route: Route,
    pools: Sequence[PoolState],
    trace: list[tuple[str, str]],
) -> Ranking:
    """Rank eligible pools as the route lists them, predicting nothing."""
    return Ranking(list(pools))


def slo_miss(profile: RequestProfile, prediction: Prediction) -> str | None:
    """Say which SLO target the prediction's upper bound misses, or None."""
    if profile.ttft_ms is not None and prediction.ttft_upper_s * 1e3 > profile.ttft_ms:
        return f"p90 ttft {prediction.ttft_upper_s * 1e3:.0f} ms > {profile.ttft_ms:.0f} ms"
    if (
        profile.tpot_ms is not None
        and profile.endpoint != "embeddings"
        and prediction.tpot_upper_s * 1e3 > profile.tpot_ms
    ):
        return f"p90 tpot {prediction.tpot_upper_s * 1e3:.1f} ms > {profile.tpot_ms:.0f} ms"
    if profile.e2e_ms is not None and prediction.e2e_upper_s * 1e3 > profile.e2e_ms:
        return f"p90 e2e {prediction.e2e_upper_s * 1e3:.0f} ms > {profile.e2e_ms:.0f} ms"
    return None


class CostRanker:
    """Rank pools by the route's objective among those predicted to meet the SLO."""

    def __init__(
        self,
        model: Callable[[], CostModel],
        outputs: OutputLengths,
        rates: Rates | None = None,
    ):
        self._model = model
        self.outputs = outputs
        # The electricity's price and carbon per pool now (gateway/policy/tariffs.py); None:
        # each pool's own price.
        self.rates = rates

    def model_version(self) -> int:
        return self._model().version

    def predict(self, profile: RequestProfile, route: str, pool: PoolState) -> Prediction:
        """Predict the request on the pool's least-loaded backend, waiting if none is free."""
        output, model = self._output(profile, route), self._model()
        per_token, own = _kv_share(profile, output, model)
        backend = pool.most_free(
            kv_bytes=own * per_token,
            blocks=profile.blocks,
            session=profile.session,
            block_tokens=profile.block_tokens,
        )
        return self._predict(profile, pool, output, model, per_token, own, backend)

    def _output(self, profile: RequestProfile, route: str) -> int:
        if profile.endpoint == "embeddings":
            return 0
        return self.outputs.expect(route, profile.max_tokens)

    def _predict(
        self,
        profile: RequestProfile,
        pool: PoolState,
        output: int,
        model: CostModel,
        per_token: float,
        own: int,
        backend: BackendState | None,
    ) -> Prediction:
        """Predict on one pool the request whose KV cache holds `own` tokens of `per_token`
        bytes (`_kv_share`, the same for every pool of a decision), on `backend`: the one the
        router would choose there (its `most_free`, holding most of the prefix for its load),
        or None when none has room and the request would wait."""
        rate = self.rates(pool.name) if self.rates is not None else None
        pool_model = model.pool_model(pool.name, profile.model)
        if backend is not None:
            # Its prefill computes only what the backend does not hold of the prompt.
            prompt = profile.prompt_tokens
            if profile.blocks:
                held = pool.prefixes.cached(backend.name, profile.blocks)
                prompt -= profile.cached_tokens(held)
            return pool_model.predict(
                pool.name,
                max(1, prompt),
                output,
                backend.load + 1,
                0.0,
                rate,
                backend.kv_tokens(per_token) + own,
            )
        healthy = pool.healthy()
        context = max(b.kv_tokens(per_token) for b in healthy) + own
        full = pool_model.predict(
            pool.name, profile.prompt_tokens, output, healthy[0].slots, context=context
        )
        # Waiting: each request ahead frees a slot after about one service time, spread
        # over every slot of the pool.
        slots = sum(b.slots for b in healthy)
        queue_s = (len(pool.waiters) + 1) * full.e2e_s / slots
        return pool_model.predict(
            pool.name,
            profile.prompt_tokens,
            output,
            healthy[0].slots,
            queue_s,
            rate,
            context,
        )

    def __call__(
        self,
        profile: RequestProfile,
        route: Route,
        pools: Sequence[PoolState],
        trace: list[tuple[str, str]],
    ) -> Ranking:
        output, model = self._output(profile, route.name), self._model()
        per_token, own = _kv_share(profile, output, model)
        kv_bytes, blocks, session = own * per_token, profile.blocks, profile.session
        block_tokens = profile.block_tokens
        predictions: dict[str, Prediction] = {}
        # The backend each pool's prediction was made on is the one the router takes there:
        # kept, so the router does not search the pool again.
        chosen: dict[str, list[BackendState]] = {}
        for pool in pools:
            backend = pool.most_free(
                kv_bytes=kv_bytes, blocks=blocks, session=session, block_tokens=block_tokens
            )
            predictions[pool.name] = self._predict(
                profile, pool, output, model, per_token, own, backend
            )
            chosen[pool.name] = [backend] if backend is not None else []
        objective = OBJECTIVES.get(route.objective)
        if objective is None:
            return Ranking(list(pools), predictions, backends=chosen, kv_bytes=kv_bytes)
        feasible, dropped = [], []
        for pool in pools:
            miss = slo_miss(profile, predictions[pool.name])
            if miss is None:
                feasible.append(pool)
            else:
                dropped.append(pool)
                trace.append((pool.name, f"predicted to miss the SLO: {miss}"))
        if not feasible:
            fastest = sorted(pools, key=lambda p: predictions[p.name].e2e_upper_s)
            if fastest:
                trace.append((fastest[0].name, "no pool meets the SLO: the fastest leads"))
            return Ranking(
                fastest, predictions, slo_unmeetable=True, backends=chosen, kv_bytes=kv_bytes
            )
        # The pools come in the route's order (the router's candidates) and the sort is stable:
        # a tie keeps it.
        feasible.sort(key=lambda p: objective(predictions[p.name]))
        dropped.sort(key=lambda p: objective(predictions[p.name]))
        first = feasible[0]
        # A pool full of other clients' requests, or whose engine says it has no room, frees a
        # slot only when a scrape says so, not when one of ours ends: never worth waiting for.
        engine_held = any(b.engine_full or b.external for b in first.healthy())
        wait = predictions[first.name].queue_s > 0 and len(feasible) > 1 and not engine_held
        if wait:
            trace.append((first.name, "full, but cheapest with its wait and within the SLO"))
        return Ranking(
            feasible,
            predictions,
            wait_for_first=wait,
            backends=chosen,
            kv_bytes=kv_bytes,
            dropped=dropped,
        )


def _kv_share(profile: RequestProfile, output: int, model: CostModel) -> tuple[float, int]:
    """Return the KV-cache bytes one token of the request's model holds, and the tokens of its
    own share, as admission books it and records keep it: prompt, and every answer's output
    limit; the same on every pool, so a ranking computes them once."""
    limit = profile.max_tokens or model.policy.assumed_max_tokens
    own = profile.prompt_tokens + (0 if output == 0 else profile.sequences * limit)
    return model.kv_bytes_per_token(profile.model), own
