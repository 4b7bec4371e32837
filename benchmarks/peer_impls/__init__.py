"""The configurations that `benchmarks/peers.py` compares, one runner class per peer.

Every runner has ``warmup()`` (compile; never timed), ``forward() -> u_final``,
``gradient() -> (loss, dloss/du0, stats)``, ``forward_steps()`` (a closed form, or None when the
runner reports or the driver counts it) and ``stored_states()`` (what its gradient keeps, in words).
Runners are imported lazily: each configuration runs in its own process, which imports one library.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Config:
    name: str            # the table's row label and the --only key
    module: str          # peer_impls.<module>
    runner: str          # class name in that module
    kwargs: dict = field(default_factory=dict)
    countable: bool = False   # forward evaluations can be counted by a callback run on a tiny grid
    family: str = ""     # "ours" or the peer's library
    one_core: bool = False   # the worker runs pinned to one core (sched_setaffinity before the import)


def budgets(steps: int) -> tuple[int, int, int]:
    """(segment, small, large): the nested-remat segment length (~sqrt(steps)), a small snapshot
    budget (~sqrt(steps)/5) and the budget nested remat holds (outer carries + one segment)."""
    seg = max(1, round(math.sqrt(steps)))
    small = max(4, round(math.sqrt(steps) / 5))
    large = math.ceil(steps / seg) + seg
    return seg, small, large


def reference(steps: int) -> Config:
    """The float64 reference at any size: nested remat in JAX with x64 enabled (fast, little memory),
    from the same float32 initial condition."""
    seg, _, _ = budgets(steps)
    return Config("float64-reference", "jax_peers", "JaxRunner", {"mode": "nested", "segment": seg, "x64": True},
                  False, "jax")


def configs(steps: int) -> list[Config]:
    seg, small, large = budgets(steps)
    return [
        Config("jax-scan", "jax_peers", "JaxRunner", {"mode": "scan"}, True, "jax"),
        Config("jax-remat-per-step", "jax_peers", "JaxRunner", {"mode": "remat"}, True, "jax"),
        Config(f"jax-nested-remat-{seg}", "jax_peers", "JaxRunner", {"mode": "nested", "segment": seg}, True,
               "jax"),
        # JAX on one core is often its best configuration on a busy 2-core machine
        Config("jax-scan-1core", "jax_peers", "JaxRunner", {"mode": "scan"}, True, "jax", True),
        Config(f"jax-nested-remat-{seg}-1core", "jax_peers", "JaxRunner", {"mode": "nested", "segment": seg}, True,
               "jax", True),
        Config(f"equinox-k{small}", "jax_peers", "JaxRunner", {"mode": "equinox", "k": small}, True, "equinox"),
        Config(f"equinox-k{large}", "jax_peers", "JaxRunner", {"mode": "equinox", "k": large}, True, "equinox"),
        Config("warp-tape", "warp_peer", "WarpRunner", {}, False, "warp"),
        Config("ours-storeall", "ours", "OursRunner", {"schedule": "storeall"}, False, "ours"),
        Config(f"ours-revolve-{small}", "ours", "OursRunner", {"schedule": "revolve", "snapshots": small},
               False, "ours"),
        # half the states nested remat holds: the "half the memory of the best peer"
        Config(f"ours-revolve-{large // 2}", "ours", "OursRunner", {"schedule": "revolve", "snapshots": large // 2},
               False, "ours"),
        Config(f"ours-revolve-{large}", "ours", "OursRunner", {"schedule": "revolve", "snapshots": large},
               False, "ours"),
        # the same with recomputations step by step from Python (before native step loops)
        Config(f"ours-revolve-{large}-stepwise", "ours", "OursRunner",
               {"schedule": "revolve", "snapshots": large, "native": False}, False, "ours"),
        Config(f"ours-multilevel-{small}+{large}", "ours", "OursRunner",
               {"schedule": "multilevel", "snapshots": small, "disk": large}, False, "ours"),
    ]
