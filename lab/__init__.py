"""The routing lab: the routing benchmark, its baselines, its oracle and its scenarios.

It replays a request trace through every strategy on the what-if's virtual clock
(`gateway.whatif`), and compares a slice of it with a running gateway; the gateway never
imports it, and `gateway bench routing` finds it by its entry point (`command`).

- `bench`: every strategy on one trace, checked against the targets; the result file;
- `strategies`: the strategies by name: the learned router (the what-if's), the fixed orders,
  the baselines and the oracle;
- `balancing`: round-robin and least-loaded over backends, blind to prompts;
- `session_hash`: each conversation on the backend its session hashes to (vLLM's router);
- `approximate_prefix`: SGLang's cache-aware router, on trees of what it routed where;
- `oracle`: the cheapest feasible backend per request under the true physics, computed;
- `scenario`: the scenario files: events hidden from the router, tariffs known to it;
- `live`: a slice of the trace through a running gateway, on the wall clock;
- `command`: `gateway bench routing`.

docs/routing.md explains the figures and records the measured ones.
"""
