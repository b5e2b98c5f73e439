"""The agent's pure core: values in, decisions out, ``now`` passed in; no I/O, no logger.

``events`` (notices, pods, the values every room passes), ``store`` (which notices are live,
which pods are under them, what is due at ``now``; the one owner of a notice from detection to
eviction) and ``podcodec`` (the pod file's content). See docs/architecture.md.
"""
