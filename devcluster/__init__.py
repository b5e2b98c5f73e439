"""A real local Kubernetes control plane for tests, the demo and the benchmarks.

``build`` compiles etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok
from their published Go modules (pinned in ``devcluster/go/*/go.mod``) into a cache outside the
repository; ``up`` starts them on loopback ports, ``down`` stops them, ``nodes`` adds fake GPU
nodes that kwok runs. Nothing here imitates the Kubernetes API.
"""
