"""Verifier implementations that run inside the sandbox agent's forked workers.

Each submodule is imported lazily by the agent; keep this package free of heavy imports so that
importing ``sandboxd.verifiers`` itself stays cheap.
"""
