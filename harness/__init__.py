"""Real servers on loopback for the tests and the benchmarks: simulators, gateways, databases.

No pytest here: the benchmarks start the same processes the tests do.
"""
