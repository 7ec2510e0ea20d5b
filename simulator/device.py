"""One simulated device: a discrete-event engine on simulated time.

The device runs at most `slots` requests at once; the others wait in arrival order. Each
model's requests run in steps, as vLLM's scheduler runs them with chunked prefill: every step
decodes one token for each sequence decoding, then spends what is left of the step's token
budget (`max_batched_tokens`, decodes counting one token each) on the prompts being prefilled,
oldest admitted first, a prompt that does not fit taking what is left and the rest in later
steps. A step lasts

    step = scale · (fixed + decode_per_seq · (N - 1) + kv_read · max(0, C - kv_fast_tokens)
                    + Σ chunks (prefill_per_token · k + prefill_attention · ((s + k)² - s²)))

with `fixed` the prefill's fixed cost where the step carries a chunk and the decode step's
otherwise, N the sequences decoding on the whole device when it starts (no decode terms in a
step of chunks alone), C their context tokens (prompt and tokens so far), and a chunk of k
tokens starting at token s of its prompt (host_transfer_per_token counts in prefill_per_token).
So a prompt's prefill holds up every sequence decoding beside it and every prompt admitted
after it: compute a prefix cache spares is compute the device's other requests get.

A prompt starts at `c`, the leading tokens the device's prefix cache holds (in whole blocks, at
most all but the last token, which is computed to give the first token;
simulator/prefix_cache.py); `h` of them in host memory are loaded back at `host_load` a token in
its first chunk. A prompt alone, in one chunk, so takes

    prefill = scale · (prefill_fixed + prefill_per_token · (prompt − c)
                       + prefill_attention · (prompt² − c²) + host_load · h)

and each further chunk adds a step's fixed cost. The step that computes a prompt's last chunk
gives its first token and caches its blocks; it decodes from the next step on. A request holds
its slot from admission until its last token; nothing is preempted. Power follows the number
of slots in use and is integrated into an energy counter over simulated time. The KV cache a
running request reserves (its prompt and output tokens) is counted against `kv_cache_tokens`,
which the engines' series report (simulator/engines.py); it does not hold requests back.

Requests of other clients (`set_external`, simulator/external.py) never end: each takes a
slot, decodes in the batch (N counts it), draws power and reserves its KV cache; past the
slots they wait, ahead of every later arrival.

The engine reads no clock: its owner advances it to a simulated instant and it processes
every event due by then in order, so coarse timers only change when tokens are delivered,
never when they were decoded.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from enum import Enum

from simulator.power import PowerCurve
from simulator.prefix_cache import PrefixCache
from simulator.profile import ModelSpec, ParkingFigures, PrefixCacheFigures, Timing

NO_PREFIX_CACHE = PrefixCacheFigures()
NO_PARKING = ParkingFigures()


class JobState(Enum):
    """Where a job is in its passage through a device."""

    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"
    CANCELLED = "cancelled"


class Job:
    """One request's occupancy of a device: queue, prefill, decode, done.

    `output_tokens` is 0 for an embedding, which is one prefill-like pass. `blocks` are the
    chained ids of the prompt's blocks, in the device's prefix cache's block size; `token_ids`,
    where given, its tokens, which the cache's events name.
    """

    def __init__(
        self,
        model: ModelSpec,
        prompt_tokens: int,
        output_tokens: int,
        *,
        blocks: Sequence[int] = (),
        token_ids: Sequence[int] = (),
        on_progress: Callable[[], None] | None = None,
    ):
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.blocks = blocks
        self.token_ids = token_ids
        self.cached_tokens = 0  # of the prompt, found in the prefix cache at admission
        self._prefilled = 0  # prompt tokens computed or found cached so far
        self._host_tokens = 0  # cached tokens to load back from host memory with the first chunk
        self.on_progress = on_progress
        self.state = JobState.QUEUED
        self.device_index: int | None = None
        self.arrived_at: float | None = None
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._batch: _Batch | None = None
        self._join_step: int | None = None
        self._emitted_when_cancelled = 0

    @property
    def tokens_emitted(self) -> int:
        """Return how many output tokens the device has decoded so far."""
        if self.state is JobState.DONE:
            return self.output_tokens
        if self.state is JobState.CANCELLED:
            return self._emitted_when_cancelled
        if self.state is not JobState.DECODE:
            return 0
        if self._join_step is None or self._batch is None:
            return 1
        return min(self.output_tokens, 1 + self._batch.steps - self._join_step)

    @property
    def done(self) -> bool:
        """Say whether the job was served to its last token."""
        return self.state is JobState.DONE

    @property
    def finished(self) -> bool:
        """Say whether the job has left the device, served or cancelled."""
        return self.state is JobState.DONE or self.state is JobState.CANCELLED

    def _notify(self) -> None:
        if self.on_progress is not None:
            self.on_progress()


class _Batch:
    """The requests of one model on one device, stepping together: the sequences decoding in
    lockstep and the prompts being prefilled in chunks beside them."""

    def __init__(self, model: ModelSpec):
        self.scale = model.cost_scale
        self.members: set[Job] = set()
        self.joining: list[Job] = []
        self.prefilling: deque[Job] = deque()  # admitted, prompt not yet computed, oldest first
        self.chunks: list[tuple[Job, int]] = []  # the prompt tokens the running step computes
        self.steps = 0
        self.step_end: float | None = None
        # (step at which the job emits its last token, tie-breaker, job)
        self.finishes: list[tuple[int, int, Job]] = []
        self._prompts = 0  # the members' prompt tokens
        self._joined = 0  # the steps at which they joined, summed

    def add(self, job: Job) -> None:
        job._join_step = self.steps
        self.members.add(job)
        self._prompts += job.prompt_tokens
        self._joined += self.steps

    def remove(self, job: Job) -> None:
        self.members.remove(job)
        self._prompts -= job.prompt_tokens
        self._joined -= job._join_step or 0

    def context_tokens(self) -> int:
        """Return the KV-cache tokens a step reads: each member's prompt and tokens so far."""
        # A member that joined at step j has emitted 1 + steps - j tokens.
        return self._prompts + len(self.members) * (1 + self.steps) - self._joined

    def backlog(self) -> tuple[int, float]:
        """Return the prompt tokens still to compute after the running step, and the sum of
        their prompts' squares still to compute (their attention)."""
        running = {id(job): tokens for job, tokens in self.chunks}
        tokens, squares = 0, 0.0
        for job in self.prefilling:
            done = job._prefilled + running.get(id(job), 0)
            tokens += job.prompt_tokens - done
            squares += job.prompt_tokens * job.prompt_tokens - done * done
        return tokens, squares


class Device:
    """A simulated accelerator: slots, an arrival-order queue, decode batches, power, energy."""

    def __init__(
        self,
        index: int,
        timing: Timing,
        slots: int,
        power: PowerCurve,
        kv_cache_tokens: int = 262144,
        prefix_cache: PrefixCacheFigures = NO_PREFIX_CACHE,
        parking: ParkingFigures = NO_PARKING,
    ):
        self.index = index
        self.slots = slots
        self.kv_cache_tokens = kv_cache_tokens
        self.power = power
        self.slow_factor = 1.0
        self.power_factor = 1.0  # the board draws this times its curve (a hot or failing part)
        self.time = 0.0
        self.energy_j = 0.0
        self.idle_energy_j = 0.0  # what it would have drawn idle over the same time
        # Parked, it draws `_parked_w` (nothing if released) and takes nothing; woken, it
        # serves from `ready_at`.
        self.parked = False
        self.released = False
        self.ready_at = 0.0
        self.wake_s = parking.wake_s
        self.released_wake_s = parking.released_wake_s
        parked_w = power.idle_w if parking.parked_w is None else parking.parked_w
        self._asleep_w = self._parked_w = min(power.idle_w, parked_w)
        self.served = 0
        self._prefill_fixed_s = timing.prefill_fixed_ms / 1e3
        self._prefill_per_token_s = (
            timing.prefill_per_token_us + timing.host_transfer_per_token_us
        ) / 1e6
        self._prefill_attention_s = timing.prefill_attention_ns / 1e9
        self.prefix_cache = PrefixCache(
            prefix_cache.capacity_tokens, prefix_cache.block_tokens, prefix_cache.host_tokens
        )
        self._host_load_s = prefix_cache.host_transfer_per_token_us / 1e6
        self._decode_fixed_s = timing.decode_fixed_ms / 1e3
        self._decode_per_seq_s = timing.decode_per_seq_ms / 1e3
        self._kv_read_s = timing.kv_read_ns / 1e9
        self._kv_fast_tokens = timing.kv_fast_tokens
        self.max_batched_tokens = timing.max_batched_tokens
        self._queue: deque[Job] = deque()
        self._batches: dict[str, _Batch] = {}
        self._holding: set[Job] = set()  # the jobs holding a slot
        self._kv_tokens = 0
        self.external = 0  # requests of other clients on this device
        self._external_tokens = 0  # the KV cache each of them reserves
        self._decoding = 0
        self._order = itertools.count()

    @property
    def active(self) -> int:
        """Return the number of requests holding a slot, other clients' included."""
        return len(self._holding) + self.external_running

    @property
    def decoding(self) -> int:
        """Return the sequences a decode step now steps, other clients' included."""
        return self._decoding + self.external_running

    @property
    def external_running(self) -> int:
        """Return how many requests of other clients hold a slot: the slots ours left them."""
        return min(self.external, max(0, self.slots - len(self._holding)))

    @property
    def external_waiting(self) -> int:
        """Return how many requests of other clients wait for a slot."""
        return self.external - self.external_running

    @property
    def queued(self) -> int:
        """Return the number of requests waiting for a slot, other clients' included."""
        return len(self._queue) + self.external_waiting

    @property
    def inflight(self) -> int:
        """Return the number of requests on this device, running or waiting."""
        return self.active + self.queued

    @property
    def kv_usage(self) -> float:
        """Return the share of the KV cache the running requests reserve (at most 1)."""
        reserved = self._kv_tokens + self.external_running * self._external_tokens
        return min(1.0, reserved / self.kv_cache_tokens)

    def holding(self) -> list[Job]:
        """Return the jobs holding a slot."""
        return list(self._holding)

    def waiting(self) -> list[Job]:
        """Return the jobs waiting for a slot, in arrival order."""
        return list(self._queue)

    @property
    def power_w(self) -> float:
        """Return the board power right now (its parked draw while parked)."""
        if self.parked:
            return self._parked_w * self.power_factor
        return self.power.watts(self.active) * self.power_factor

    def submit(self, job: Job, now: float) -> None:
        """Queue `job` at simulated instant `now`; it starts as soon as a slot is free."""
        if self.parked or now < self.ready_at:
            raise RuntimeError("a parked or waking device takes no request")
        self.advance(now)
        job.device_index = self.index
        job.arrived_at = now
        job.state = JobState.QUEUED
        self._queue.append(job)
        self._admit(now)

    def park(self, now: float, release: bool = False) -> None:
        """Switch the device off from `now`, asleep or released: it must hold no request."""
        if release and self.released_wake_s is None:
            raise RuntimeError(
                "the device's profile gives no released_wake_s: it cannot be released"
            )
        self.advance(now)
        if self._holding or self._queue:
            raise RuntimeError("a device is parked only once its requests are done")
        self.parked, self.released = True, release
        self._parked_w = 0.0 if release else self._asleep_w
        # Asleep, an engine keeps no KV cache (vLLM's sleep mode drops it): no prefix either.
        self.prefix_cache.clear()

    def wake(self, now: float) -> float:
        """Switch the device on from `now`; return the instant it can serve."""
        self.advance(now)
        if self.parked:
            wake_s = self.released_wake_s if self.released else self.wake_s
            assert wake_s is not None
            self.parked = self.released = False
            self.ready_at = now + wake_s
        return max(self.ready_at, now)

    def set_condition(self, slow_factor: float, power_factor: float, now: float) -> None:
        """From `now`, take `slow_factor` times as long for what starts, and draw `power_factor`
        times the power curve (what runs keeps the durations it started with)."""
        self.advance(now)
        self.slow_factor, self.power_factor = slow_factor, power_factor

    def set_external(self, requests: int, kv_tokens: int, now: float) -> None:
        """From `now`, carry `requests` of other clients, each reserving `kv_tokens`."""
        self.advance(now)
        self.external, self._external_tokens = requests, kv_tokens
        self._admit(now)

    def cancel(self, job: Job, now: float) -> None:
        """Withdraw `job` at `now` (its client went away) and free its slot."""
        self.advance(now)
        if job.finished:
            return
        emitted = job.tokens_emitted
        if job.state is JobState.QUEUED:
            self._queue.remove(job)
        else:
            self._release(job)
            batch = job._batch
            if batch is not None and job in batch.prefilling:
                batch.prefilling.remove(job)  # a chunk the running step computes is spent
            elif batch is not None and job in batch.members:
                batch.remove(job)
                self._decoding -= 1
            elif batch is not None and job in batch.joining:
                batch.joining.remove(job)
        job._emitted_when_cancelled = emitted
        job.state = JobState.CANCELLED
        job.finished_at = now
        self._admit(now)
        job._notify()

    def next_event_at(self) -> float | None:
        """Return the simulated instant of the next event, or None when nothing is running."""
        return self._next_event()[0]

    def advance(self, now: float) -> None:
        """Process every event due by simulated instant `now`, in order."""
        stepped: set[_Batch] = set()
        while True:
            at, batch = self._next_event()
            if at is None or batch is None or at > now:
                break
            self._integrate(at)
            self._end_step(batch, at)
            stepped.add(batch)
        if now > self.time:
            self._integrate(now)
        for batch in stepped:
            for job in batch.members:
                job._notify()

    def _next_event(self) -> tuple[float | None, _Batch | None]:
        at: float | None = None
        due: _Batch | None = None
        for batch in self._batches.values():
            if batch.step_end is not None and (at is None or batch.step_end < at):
                at, due = batch.step_end, batch
        return at, due

    def _integrate(self, until: float) -> None:
        elapsed = until - self.time
        if self.parked:
            # Nothing runs, so nothing is drawn above what the device draws at rest.
            drawn = self._parked_w * self.power_factor * elapsed
            self.energy_j += drawn
            self.idle_energy_j += drawn
        else:
            self.energy_j += self.power.watts(self.active) * self.power_factor * elapsed
            self.idle_energy_j += self.power.idle_w * self.power_factor * elapsed
        self.time = until

    def _batch(self, model: ModelSpec) -> _Batch:
        batch = self._batches.get(model.name)
        if batch is None:
            batch = self._batches[model.name] = _Batch(model)
        return batch

    def _admit(self, at: float) -> None:
        while self._queue and self.active < self.slots and not self.external_waiting:
            job = self._queue.popleft()
            job.state = JobState.PREFILL
            job.admitted_at = at
            self._holding.add(job)
            self._kv_tokens += job.prompt_tokens + job.output_tokens
            on_device, on_host = self.prefix_cache.lookup(
                self._cacheable(job.prompt_tokens, job.blocks)
            )
            size = self.prefix_cache.block_tokens
            job.cached_tokens = job._prefilled = (on_device + on_host) * size
            job._host_tokens = on_host * size
            batch = job._batch = self._batch(job.model)
            batch.prefilling.append(job)
            if batch.step_end is None:
                self._start_step(batch, at)

    def prefill(
        self, model: ModelSpec, prompt_tokens: int, blocks: Sequence[int] = ()
    ) -> tuple[float, int]:
        """Return how long a prompt admitted now would wait for its first token, and how many of
        its tokens the prefix cache holds.

        Its model's running step ends first; then its chunks follow those of the prompts
        admitted before it, beside the sequences decoding now (module docstring), as if nothing
        else arrived meanwhile.
        """
        on_device, on_host = self.prefix_cache.lookup(self._cacheable(prompt_tokens, blocks))
        size = self.prefix_cache.block_tokens
        cached = (on_device + on_host) * size
        batch = self._batches.get(model.name)
        wait, ahead, ahead_squares, members = 0.0, 0, 0.0, 0
        if batch is not None:
            if batch.step_end is not None:
                wait = max(0.0, batch.step_end - self.time)
            ahead, ahead_squares = batch.backlog()
            members = len(batch.members) + len(batch.joining)
        tokens = ahead + prompt_tokens - cached
        per_step = max(1, self.max_batched_tokens - members)
        steps = max(1, -(-tokens // per_step))
        overhead = self._prefill_fixed_s
        if members:
            overhead += self._decode_per_seq_s * max(0, self.decoding - 1)
            overhead += self._kv_read_s * max(0, self.context_tokens() - self._kv_fast_tokens)
        work = (
            steps * overhead
            + self._prefill_per_token_s * tokens
            + self._prefill_attention_s * (ahead_squares + prompt_tokens * prompt_tokens)
            - self._prefill_attention_s * cached * cached
            + self._host_load_s * on_host * size
        )
        return wait + self.slow_factor * model.cost_scale * work, cached

    def prefill_work(self, model: ModelSpec, prompt_tokens: int, cached_tokens: int) -> float:
        """Return the compute a prompt's chunks add to the steps that carry them, which every
        sequence decoding beside it waits through."""
        work = self._prefill_per_token_s * (
            prompt_tokens - cached_tokens
        ) + self._prefill_attention_s * (prompt_tokens**2 - cached_tokens**2)
        return self.slow_factor * model.cost_scale * work

    def _cacheable(self, prompt_tokens: int, blocks: Sequence[int]) -> Sequence[int]:
        """Return the blocks a prompt may find cached: whole ones before its last token."""
        return blocks[: max(prompt_tokens - 1, 0) // self.prefix_cache.block_tokens]

    def _end_step(self, batch: _Batch, at: float) -> None:
        batch.steps += 1
        finishes = batch.finishes
        while finishes and finishes[0][0] <= batch.steps:
            _, _, job = heapq.heappop(finishes)
            if job.state is not JobState.DECODE:
                continue
            batch.remove(job)
            self._decoding -= 1
            self._finish(job, at)
        for job, tokens in batch.chunks:
            if job.state is not JobState.PREFILL:
                continue  # cancelled while its chunk ran
            job._prefilled += tokens
            job._host_tokens = 0
            if job._prefilled >= job.prompt_tokens:
                batch.prefilling.remove(job)
                self._end_prefill(batch, job, at)
        batch.chunks = []
        for job in batch.joining:
            self._join(batch, job)
        batch.joining.clear()
        self._admit(at)
        self._start_step(batch, at)

    def _end_prefill(self, batch: _Batch, job: Job, at: float) -> None:
        job.first_token_at = at
        if job.blocks:
            self.prefix_cache.insert(self._cacheable(job.prompt_tokens, job.blocks), job.token_ids)
        if job.output_tokens <= 1:
            self._finish(job, at)
            return
        job.state = JobState.DECODE
        batch.joining.append(job)
        job._notify()

    def _join(self, batch: _Batch, job: Job) -> None:
        batch.add(job)
        self._decoding += 1
        last_step = batch.steps + job.output_tokens - 1
        heapq.heappush(batch.finishes, (last_step, next(self._order), job))

    def _start_step(self, batch: _Batch, at: float) -> None:
        if not batch.members and not batch.prefilling:
            batch.step_end = None
            batch.finishes.clear()  # only cancelled jobs can be left in it
            return
        work = 0.0
        if batch.members:
            work += self._decode_per_seq_s * (self.decoding - 1)
            if self._kv_read_s:
                work += self._kv_read_s * max(0, self.context_tokens() - self._kv_fast_tokens)
        budget = self.max_batched_tokens - len(batch.members)
        for job in batch.prefilling:
            if budget <= 0:
                break
            start = job._prefilled
            tokens = min(job.prompt_tokens - start, budget)
            budget -= tokens
            batch.chunks.append((job, tokens))
            end = start + tokens
            work += self._prefill_per_token_s * tokens
            work += self._prefill_attention_s * (end * end - start * start)
            work += self._host_load_s * job._host_tokens
        work += self._prefill_fixed_s if batch.chunks else self._decode_fixed_s
        batch.step_end = at + self.slow_factor * batch.scale * work

    def context_tokens(self) -> int:
        """Return the KV-cache tokens the decoding sequences read, other clients' included."""
        ours = sum(batch.context_tokens() for batch in self._batches.values())
        return ours + self.external_running * self._external_tokens

    def _finish(self, job: Job, at: float) -> None:
        job.state = JobState.DONE
        job.finished_at = at
        self._release(job)
        self.served += 1
        job._notify()

    def _release(self, job: Job) -> None:
        self._holding.discard(job)
        self._kv_tokens -= job.prompt_tokens + job.output_tokens
