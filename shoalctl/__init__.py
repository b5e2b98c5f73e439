"""``kubectl shoal``: the cluster as Shoal's scheduler sees it, read-only, from the user's
kubeconfig and RBAC (``get``/``list`` on pods, nodes, events and the PodGroup kinds).

``api`` is the only module that talks to the API server; ``views`` turns what it read into
gangs, decisions and nodes with the scheduler's own pure code (gang sources, conversion,
GPU island accounting), so the plugin sees gangs exactly as the scheduler does; ``render``
prints them (a plain table, JSON or YAML); ``cli`` is the program.
"""
