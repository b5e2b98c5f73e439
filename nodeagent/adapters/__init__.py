"""The agent's adapters: the only modules that do its I/O.

``k8s`` (the API server; the only importer of ``kubernetes``), ``providers`` (the clouds'
metadata and the Kubernetes-side signals), ``gpu`` (NVML, XID health), ``calls`` (the API
threads and the ``ClusterPort``), ``follow`` (list, then watch), ``podcache`` (the pod file),
``webhook`` and ``metrics``. The notice socket (``nodeagent/notify``) and the kubelet's
PodResources client (``nodeagent/podresources``) are adapters too. See docs/architecture.md.
"""
