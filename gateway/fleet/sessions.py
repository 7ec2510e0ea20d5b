"""Sessions: which backend serves each conversation or agent run the client names.

A client that names its session (`SESSION_HEADERS`, or OpenAI's `prompt_cache_key` body field)
says that its requests share a prefix: the next turn should go where the last one's KV cache
is. The table keeps, per tenant and session key, the backend that answered it last, least recently
used first, up to `MAX_SESSIONS`. Within a pool the router counts that backend as holding the
whole prompt (`PoolState.most_free`): a hint priced as a cache hit, so a session goes back to
its backend unless another is much less loaded, and a canary or an exploration still draws it.
The session is released (forgotten, so the next request is routed afresh) when its backend
answers one of its requests outside the SLO, or leaves the fleet.
"""

from __future__ import annotations

from collections import OrderedDict

# Headers agent and chat clients send to name a session: vLLM's router and production stack
# (`x-session-id`), LiteLLM (`x-litellm-session-id`), xAI's API (`x-grok-conv-id`). A body's
# `prompt_cache_key` (OpenAI's Chat Completions and Responses APIs) names one too.
# vLLM's router and production stack, LiteLLM, xAI; then the affinity keys NVIDIA's aiperf sends
# beside X-Session-ID (Dynamo's, SGLang's model gateway's, its own).
SESSION_HEADERS = (
    "x-session-id",
    "x-litellm-session-id",
    "x-grok-conv-id",
    "x-dynamo-session-id",
    "x-smg-routing-key",
    "x-session-affinity",
)
MAX_SESSIONS = 100_000
MAX_KEY_CHARS = 256  # a longer key is cut: sessions are told apart well before that


class Sessions:
    """The backend each named session was last served by."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._backends: OrderedDict[str, str] = OrderedDict()

    def backend(self, session: str) -> str | None:
        """Return the backend the session sticks to, or None."""
        return self._backends.get(session)

    def served(self, session: str, backend: str) -> None:
        """Record that the backend served the session's latest request."""
        self._backends[session] = backend
        self._backends.move_to_end(session)
        if len(self._backends) > self.limit:
            self._backends.popitem(last=False)

    def release(self, session: str) -> None:
        """Forget the session's backend: its next request is routed afresh."""
        self._backends.pop(session, None)

    def missed(self, session: str, backend: str) -> None:
        """Release the session if `backend`, which answered one of its requests too slowly, is
        still the one it sticks to (a later request may have moved it already)."""
        if self._backends.get(session) == backend:
            del self._backends[session]

    def forget_backends(self, kept: set[str]) -> None:
        """Release every session whose backend is not among `kept` (a new policy version's)."""
        for session in [s for s, b in self._backends.items() if b not in kept]:
            del self._backends[session]

    def __len__(self) -> int:
        return len(self._backends)
