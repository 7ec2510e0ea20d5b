"""Simulated inference hardware: an OpenAI-compatible backend per GPU, ASIC or CIM pool.

Timing, power and precision follow a hardware profile (`simulator/profiles/*.yaml`);
power is exposed the way real fleets expose it (DCGM exporter metric names). See
docs/simulator.md for the model and its figures.

    profile      hardware figures as typed data       power     power curve fitted to them
    device       discrete-event engine of one device  fleet     devices driven on the clock
    prefix_cache computed prompt prefixes kept (LRU)
    clock        scaled simulated clock               answers   reference text, harmful errors
    words        vocabulary, synonyms as concepts     precision near ties, noise, logprobs
    tokenizer    the simulator's tokenizer            embeddings  concept vectors
    schema       OpenAI request validation            responses   OpenAI response bodies, SSE
    faults       injected faults                      metrics   Prometheus exposition
    exchange     raw ASGI request/response            app       the HTTP surface
    server       uvicorn wiring                       cli       command line
"""
