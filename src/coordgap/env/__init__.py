"""The dining-philosophers environment: table state, protocols, observations and reward."""
