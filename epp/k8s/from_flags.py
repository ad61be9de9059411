"""The Kubernetes pieces `epp serve`'s flags ask for: the pool's endpoint source (an InferencePool
or pool-less pod selector, as GIE's) and the Lease campaign of --ha-enable-leader-election.

Both `epp.serve` and the worker supervisor build them (the supervisor campaigns once per pod), so
they live here rather than in `epp.serve`, which imports the supervisor.
"""

from __future__ import annotations

import argparse
import os

from epp.datastore.endpoints import Datastore
from epp.datastore.model_rewrites import ModelRewriteStore
from epp.k8s import connections as k8s_connections
from epp.k8s import leader as k8s_leader
from epp.k8s import objectives as k8s_objectives
from epp.k8s import operator as k8s_operator
from epp.k8s import pools as k8s_pools


def leader_elector(
    args: argparse.Namespace, pool_operator: k8s_operator.PoolOperator | None
) -> k8s_leader.LeaderElector | None:
    """GIE's --ha-enable-leader-election: a campaign for the pool's Lease, or None when off."""
    if not args.ha_enable_leader_election:
        return None
    if pool_operator is None:
        raise ValueError(
            "--ha-enable-leader-election needs a Kubernetes pool (--pool-name or --endpoint-selector): "
            "the Lease lives in the pool's namespace"
        )
    if pool_operator.pool_name is not None:
        name = pool_operator.pool_name
    else:  # pool-less: GIE names the Lease after the Deployment, from POD_NAME
        name = k8s_leader.deployment_name(os.environ.get("POD_NAME", ""))
    return k8s_leader.LeaderElector(
        k8s_connections.load(args.kubeconfig),  # the pool operator's, read again
        namespace=pool_operator.namespace,
        name=k8s_leader.lease_name(pool_operator.namespace, name),
        timing=k8s_leader.Timing(
            lease_duration=args.ha_lease_duration,
            renew_deadline=args.ha_renew_deadline,
            retry_period=args.ha_retry_period,
        ),
    )


def kubernetes_source(
    args: argparse.Namespace,
    datastore: Datastore,
    objective_store: k8s_objectives.ObjectiveStore | None = None,
    rewrite_store: ModelRewriteStore | None = None,
) -> k8s_operator.PoolOperator | None:
    """The Kubernetes endpoint source the flags ask for (GIE's), or None.

    --endpoint-selector (+ --endpoint-target-ports): pool-less mode. --pool-name without
    --endpoints/--endpoints-file: watch that InferencePool. Raises ValueError on bad flags or
    no cluster configuration.
    """
    namespace = args.pool_namespace or os.environ.get("NAMESPACE") or "default"
    pool: k8s_pools.PoolSpec | None = None
    if args.endpoint_selector or args.endpoint_target_ports:
        if not (args.endpoint_selector and args.endpoint_target_ports):
            raise ValueError("--endpoint-selector and --endpoint-target-ports go together")
        if args.pool_name and not (args.endpoints or args.endpoints_file):
            raise ValueError("give either --pool-name or --endpoint-selector, not both")
        pool = k8s_pools.PoolSpec(
            selector=k8s_pools.parse_selector(args.endpoint_selector),
            target_ports=k8s_pools.parse_target_ports(args.endpoint_target_ports),
        )
    elif not args.pool_name or args.endpoints or args.endpoints_file:
        return None
    return k8s_operator.PoolOperator(
        datastore,
        connection=k8s_connections.load(args.kubeconfig),
        namespace=namespace,
        pool_name=None if pool is not None else args.pool_name,
        pool=pool,
        objective_store=objective_store,
        rewrite_store=rewrite_store,
    )
