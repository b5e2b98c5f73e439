"""The mutating admission webhook that wires Shoal's pods for notices and checkpoints.

``wiring`` is the pure core (a pod in, JSON Patch operations and warnings out); ``certs`` makes
the serving certificate when none is given; ``server`` is the aiohttp HTTPS endpoint that answers
the API server's AdmissionReviews. Keeping the MutatingWebhookConfiguration's ``caBundle`` is an
API write and lives with the other adapters, in ``scheduler/k8s/webhook_config.py``.
"""
