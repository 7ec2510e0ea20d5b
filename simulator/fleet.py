"""The devices behind one port, driven in real time on the scaled clock."""

from __future__ import annotations

import asyncio

from simulator.clock import ScaledClock
from simulator.device import Device, Job
from simulator.power import PowerCurve
from simulator.profile import Profile


class Fleet:
    """Run each device's engine against the scaled clock and place requests on devices.

    Each device keeps one wake-up timer at its next event; on waking it processes every
    event due by now, so timer granularity delays delivery but never changes simulated time.
    """

    def __init__(self, profile: Profile, devices: int, clock: ScaledClock):
        if devices < 1:
            raise ValueError(f"a fleet needs at least one device, got {devices}")
        self.clock = clock
        self.devices = [
            Device(
                index,
                profile.timing,
                profile.slots,
                PowerCurve(profile.power),
                profile.kv_cache_tokens,
                profile.prefix_cache,
                profile.parking,
            )
            for index in range(devices)
        ]
        self._timers: list[asyncio.TimerHandle | None] = [None] * devices
        self._timer_at: list[float | None] = [None] * devices

    @property
    def sleeping(self) -> bool:
        """Return whether the devices are parked or still waking (vLLM's is_sleeping)."""
        now = self.clock.now()
        return any(d.parked or now < d.ready_at for d in self.devices)

    def sleep(self) -> bool:
        """Park every device now (vLLM's sleep, level 1); return False while one holds requests."""
        now = self.clock.now()
        if any(d.holding() or d.waiting() for d in self.devices):
            return False
        for device in self.devices:
            device.park(now)
        return True

    async def wake_up(self) -> None:
        """Wake every device and return once they serve, as vLLM's /wake_up does."""
        ready = max(device.wake(self.clock.now()) for device in self.devices)
        while (delay := self.clock.wall_delay(ready)) > 0:
            await asyncio.sleep(delay)

    def place(self) -> Device:
        """Return the device with the fewest requests in flight (the lowest index on a tie)."""
        return min(self.devices, key=lambda device: device.inflight)

    def submit(self, device: Device, job: Job) -> None:
        """Start `job` on `device` now."""
        device.submit(job, self.clock.now())
        self._wake_later(device)

    def cancel(self, job: Job) -> None:
        """Withdraw `job` from its device now, freeing its slot."""
        if job.device_index is None or job.finished:
            return
        device = self.devices[job.device_index]
        device.cancel(job, self.clock.now())
        self._wake_later(device)

    def sync(self) -> None:
        """Bring every device up to now, so power and energy readings are current."""
        now = self.clock.now()
        for device in self.devices:
            device.advance(now)
            self._wake_later(device)

    def set_external(self, requests: int, kv_tokens: int) -> None:
        """Spread `requests` of other clients over the devices, each reserving `kv_tokens`."""
        now = self.clock.now()
        count = len(self.devices)
        for device in self.devices:
            share = requests // count + (1 if device.index < requests % count else 0)
            device.set_external(share, kv_tokens, now)
            self._wake_later(device)

    def set_slow_factor(self, factor: float) -> None:
        """Make every device `factor` times slower from now on."""
        self.sync()
        for device in self.devices:
            device.slow_factor = factor

    def _wake_later(self, device: Device) -> None:
        index = device.index
        at = device.next_event_at()
        timer = self._timers[index]
        if timer is not None:
            scheduled = self._timer_at[index]
            if at is not None and scheduled is not None and scheduled <= at:
                return
            timer.cancel()
            self._timers[index] = None
        if at is None:
            return
        delay = max(0.0, self.clock.wall_delay(at))
        self._timer_at[index] = at
        self._timers[index] = asyncio.get_running_loop().call_later(delay, self._wake, device)

    def _wake(self, device: Device) -> None:
        self._timers[device.index] = None
        device.advance(self.clock.now())
        self._wake_later(device)
