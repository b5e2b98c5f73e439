"""The scheduler's view of the cluster, and the snapshots each cycle decides on.

Pod state machine in the cache (as in kube-scheduler's)::

    (unbound) --assume(node)--> assumed --add/update with spec.nodeName--> bound
        ^                          |                                          |
        +-------forget-------------+  (bind failed, or no confirmation       remove
                                       before the assume deadline)

An assumed pod counts on its node exactly like a bound one, so the next cycle cannot give the
same GPUs to someone else while the binding is in flight. ``forget`` undoes an assume on every
failure path; a watch event that shows the pod bound (anywhere) confirms and clears it.

Thread-safe: informers write from their threads while the scheduling loop takes snapshots.
Per-node aggregates are kept up to date on every change, so a snapshot costs a dictionary copy,
not a pass over every pod.
"""

from scheduler.cache.cache import Cache, Snapshot, node_state

__all__ = ["Cache", "Snapshot", "node_state"]
