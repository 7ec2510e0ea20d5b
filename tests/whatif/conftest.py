"""The replay's world: the default policy and slices of the production traces."""

from replayworld import mixed, mooncake, policy, requests, trace

__all__ = ["mixed", "mooncake", "policy", "requests", "trace"]
