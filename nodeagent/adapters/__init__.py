"""The agent's adapters: the only modules that do its I/O.

``k8s`` (the API server; the only importer of ``kubernetes``), ``providers`` (the clouds'
metadata and the Kubernetes-side signals), ``gpu`` (NVML, XID health), ``podresources`` (the
kubelet's PodResources API: which GPU serves which pod), ``calls`` (the API threads),
``follow`` (list, then watch), ``podcache`` (the pod file), ``webhook`` and ``metrics``. The
notice socket (``nodeagent/notify``) is an adapter too. The protocols they serve and use are in
``nodeagent/core/ports.py``. See docs/architecture.md.
"""
