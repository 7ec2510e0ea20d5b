"""The routing benchmark: replay a request trace through the real router on a virtual clock.

- `trace`: read a trace (arrival, prompt tokens, generated tokens);
- `world`: the simulated fleet, one simulator device per backend, which alone knows the truth;
- `strategies`: the learned router and the baselines, all through `decide()`;
- `learner`: the cost model learned online from the replay's measurements;
- `timeline`: the discrete-event replay of one strategy;
- `summary`: energy, cost, SLO attainment, latency and pool shares of a replay;
- `oracle`: the cheapest feasible pool per request under the true physics, computed;
- `bench`: every strategy on one trace.

docs/routing.md explains the figures and records the measured ones.
"""
