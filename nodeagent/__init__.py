"""The Shoal node agent: spot-revocation and GPU-health watcher that gets workers out alive."""
