"""The cost model: per pool, how long a request will take there and what it will draw and cost.

It starts from a physics prior computed from the capability matrix (gateway/policy/physics.py)
and learns a multiplicative residual from what the gateway measured (`train.py`); `model.py`
evaluates both on the request path in microseconds; `store.py` keeps every trained version with
its error.
"""
