"""The what-if: a policy change replayed on a virtual clock before it is applied.

The requests a period recorded are replayed through the real router and a cost model learned
online, on simulated devices, under the active policy and under a proposed one
(`gateway policy simulate`, `POST /admin/policy/simulate`):

- `simulate`: the period's recorded requests, replayed under both policies and compared;
- `trace`: a request trace (arrival, prompt tokens, generated tokens, prefix blocks), read from a
  file or from the records;
- `hardware`: what a replay asks of a hardware model, and loading one by its entry point name;
- `world`: the simulated fleet, one device of the hardware model per backend, which alone knows
  the truth;
- `conditions`: the devices' factors and the pools' rates over a replay (steady by default);
- `strategy`: how a replay routes, and the gateway's own learned router;
- `learner`: the cost model learned online from the replay's measurements;
- `timeline`: the discrete-event replay of one strategy;
- `summary`: one replay measured: energy, cost, SLO attainment, goodput, latency, pool shares.

The routing benchmark (`lab/`, `gateway bench routing`) replays traces on the same timeline
through its baselines and oracle; docs/routing.md explains the figures.
"""
