"""The simulated world a replay runs against: a device of the hardware model per backend of
each live pool that serves the replayed model (a pool of other models would only idle, and the
oracle leaves it out of the fleet too).

The world is the only part of a replay that knows the hardware's true figures: each backend is a
device the hardware model (`gateway.whatif.hardware`; the simulator's by default) builds for its
pool's kind, so its timing and power are the hardware model's, not the policy's nominal ones.
The router sees the world only as the live gateway does: slots it counts itself, and an energy
counter it reads.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gateway.energy.ledger import BackendLedger
from gateway.fleet.state import BackendState, Fleet
from gateway.policy.definition import Policy
from gateway.policy.tariffs import Rate
from gateway.whatif.hardware import Device, Hardware


@dataclass(eq=False, slots=True)
class SimulatedBackend:
    """One backend of the fleet and the simulated device behind it."""

    state: BackendState
    device: Device
    ledger: BackendLedger
    slot_s: float = 0.0  # slot-seconds its requests held, admission to last token
    # Its energy above idle priced at the rate in force when it was drawn (the conditions'
    # rate), up to `charged_j` of it.
    energy_usd: float = 0.0
    carbon_g: float = 0.0
    charged_j: float = 0.0
    # All its energy, idle included, at the carbon intensity in force when it was drawn, up to
    # `charged_fleet_j` of it: the fleet's carbon.
    fleet_carbon_g: float = 0.0
    charged_fleet_j: float = 0.0

    def charge(self, rate: Rate) -> None:
        """Price the energy drawn since the last charge at `rate`: above idle in dollars and
        carbon, all of it in carbon."""
        drawn = self.energy_above_idle_j
        self.energy_usd += (drawn - self.charged_j) * rate.usd_per_j
        self.carbon_g += (drawn - self.charged_j) * rate.g_co2_per_j
        self.charged_j = drawn
        total = self.device.energy_j
        self.fleet_carbon_g += (total - self.charged_fleet_j) * rate.g_co2_per_j
        self.charged_fleet_j = total

    @property
    def energy_above_idle_j(self) -> float:
        """Return the energy the device drew above its true idle power so far."""
        return self.device.energy_j - self.device.idle_energy_j


def build_world(
    policy: Policy, fleet: Fleet, models: Collection[str], hardware: Hardware
) -> dict[str, SimulatedBackend]:
    """Put a fresh device of `hardware` behind every backend of every live pool serving `models`."""
    sizes = {model: policy.params_b(model) for model in models}
    world: dict[str, SimulatedBackend] = {}
    for pool in fleet.pools.values():
        if not pool.spec.live:
            continue  # shadow-only pools serve nothing live, and shadow copies are not replayed
        if not set(models) & set(pool.spec.models):
            continue  # the router never sends it a request of the trace
        for backend in pool.backends:
            device = hardware.device(pool.spec.kind, sizes)
            # The gateway starts from the pool's nominal idle draw and learns the real one.
            ledger = BackendLedger(idle_w=pool.spec.power.idle_w)
            world[backend.name] = SimulatedBackend(backend, device, ledger)
    return world
