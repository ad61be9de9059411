"""The built-in scheduling plugins, one module each. Importing this package registers them all.

Adding a plugin: a new module here whose class carries `@registry.register("<type>")`, one line
below, and its test; `tests/scheduling/test_registry.py` pins the list of type names.
"""

from epp.scheduling.plugins import (
    bounded_load_filter,
    concurrency_detector,
    dynamo_cost_scorer,
    header_based_testing_filter,
    inflight_load_scorer,
    kv_cache_utilization_scorer,
    label_selector_filter,
    load_aware_scorer,
    lora_affinity_scorer,
    max_score_picker,
    no_hit_lru_scorer,
    precise_prefix_cache_scorer,
    predicted_ttft_scorer,
    prefix_cache_scorer,
    queue_scorer,
    random_picker,
    role_filter,
    round_robin_picker,
    running_requests_size_scorer,
    sglang_cache_aware_picker,
    single_profile_handler,
    token_load_scorer,
    utilization_detector,
    weighted_random_picker,
)

__all__ = [
    "bounded_load_filter",
    "concurrency_detector",
    "dynamo_cost_scorer",
    "header_based_testing_filter",
    "inflight_load_scorer",
    "kv_cache_utilization_scorer",
    "label_selector_filter",
    "load_aware_scorer",
    "lora_affinity_scorer",
    "max_score_picker",
    "no_hit_lru_scorer",
    "precise_prefix_cache_scorer",
    "predicted_ttft_scorer",
    "prefix_cache_scorer",
    "queue_scorer",
    "random_picker",
    "role_filter",
    "round_robin_picker",
    "running_requests_size_scorer",
    "sglang_cache_aware_picker",
    "single_profile_handler",
    "token_load_scorer",
    "utilization_detector",
    "weighted_random_picker",
]
