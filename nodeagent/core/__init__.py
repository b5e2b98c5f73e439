"""The agent's pure core: values in, decisions out, ``now`` passed in; no I/O, no logger.

``events`` (notices, pods, the values every room passes), ``store`` (which notices are live,
which pods are under them, what is due at ``now``; the one owner of a notice from detection to
eviction), ``podcodec`` (the pod file's content), ``skew`` (the clock's offset from the servers'
``Date`` headers, and when a skew is warned about) and ``ports`` (the protocols between the
rooms and the adapters). See docs/architecture.md.
"""
