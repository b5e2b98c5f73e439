"""``make demo``: elastic gangs surviving a spot revocation on the embedded local cluster."""
