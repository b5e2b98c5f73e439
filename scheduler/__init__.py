"""The Shoal scheduler: elastic gangs placed all-or-nothing at their minimum, topology-aware.

Run it with ``python -m scheduler --kubeconfig PATH [--config FILE]`` (``--help`` lists every
option and its environment variable). Pods opt in with ``spec.schedulerName: shoal-scheduler``.

A gang is a PodGroup (``scheduling.x-k8s.io/v1alpha1``, pods labelled
``scheduling.x-k8s.io/pod-group``) or the pods sharing a ``shoal.dev/gang`` label, with
``shoal.dev/min-member`` / ``shoal.dev/max-member`` annotations (set the minimum: without it the
minimum is every member pod that exists at the time, which moves while a controller is still
creating them). ``shoal.dev/topology-required: <node label>`` keeps a gang inside one value of
that label; ``shoal.dev/topology-preferred`` tries that label first.

Layout (pure core, thin adapters; see docs/architecture.md):

- ``model`` values; ``gang`` gangs from pods and PodGroups; ``placement`` filters, scores and
  the gang search; ``topology`` NVLink island accounting; ``cache`` the cluster view with
  assume/forget; ``queue`` order and backoff; ``cycle`` one decision; ``reclaim`` victims.
- ``runner`` the loop that applies decisions through two protocols (binder, reporter);
  ``k8s`` the only package that talks to the API server; ``app``, ``settings``, ``health``,
  ``metrics`` the program around them.
"""
