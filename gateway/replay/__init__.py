"""The routing benchmark: replay a request trace through the real router on a virtual clock.

- `trace`: read a trace (arrival, prompt tokens, generated tokens, prefix blocks);
- `hardware`: what a replay asks of a hardware model, and loading one by its entry point name;
- `world`: the simulated fleet, one device of the hardware model per backend, which alone knows
  the truth;
- `strategies`: the learned router and the baselines, all through `decide()`;
- `balancing`: round-robin and least-loaded over backends, blind to prompts;
- `session_hash`: each conversation on the backend its session hashes to (vLLM's router);
- `approximate_prefix`: SGLang's cache-aware router, on trees of what it routed where;
- `learner`: the cost model learned online from the replay's measurements;
- `timeline`: the discrete-event replay of one strategy;
- `summary`: energy, cost, SLO attainment, goodput, latency and pool shares of a replay;
- `oracle`: the cheapest feasible backend per request under the true physics, computed;
- `bench`: every strategy on one trace.

docs/routing.md explains the figures and records the measured ones.
"""
