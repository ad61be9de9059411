"""A small fleet and shared-prefix workload that every policy runs through in well under a second."""

from __future__ import annotations

from epp.bench.workload import Fleet
from epp.bench.workloads import SeedStress
from epp.sim.profiles import Profile, get_profile

PODS = 4
PROFILE: Profile = get_profile("tiny").replace(name="tiny-bench", num_gpu_blocks=64)  # 2,048 tokens a pod
FLEET = Fleet(PODS, PROFILE.num_gpu_blocks * PROFILE.block_size, PROFILE.max_model_len)


class SmallStress(SeedStress):
    """seed-stress's shape shrunk to the tiny engine: 8 users, 11 shared prefixes of 256-512 tokens
    (55% of the fleet's KV cache, as seed-stress sizes them: a pod holds about a third of them)."""

    users = 8
    prefix_tokens = (256, 512)
    query_tokens = (16, 64)
    output_tokens = (4, 16)
    think_s = (0.05, 0.2)


def small(seed: int = 7, scale: float = 0.01) -> SmallStress:
    """18 s of virtual time (three 6-s stages, sharing 50/70/90%)."""
    return SmallStress(seed=seed, scale=scale, fleet=FLEET)
