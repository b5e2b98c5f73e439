"""The Kubernetes adapter: the only package that imports the official client.

``view`` (list/watch informers feeding the cache), ``status`` (binder, conditions, Events,
PodGroup status), ``client`` (API client and rate limit), ``convert`` (raw JSON to core values).
Nothing here decides anything; decisions are made by the pure core.
"""
