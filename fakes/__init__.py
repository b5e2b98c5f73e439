"""Test doubles for what cannot exist on a laptop: the clouds' metadata servers.

They are real HTTP servers on loopback that follow each cloud's documented protocol (headers,
status codes, tokens, long-poll), plus fault injection: 503 blips, slow answers, garbage,
oversized bodies and wrong content types. Used by the tests and the benchmark, never by the
agent itself.
"""
