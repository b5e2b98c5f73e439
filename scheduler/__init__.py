"""The Shoal scheduler: elastic gangs placed all-or-nothing at their minimum, topology-aware."""
