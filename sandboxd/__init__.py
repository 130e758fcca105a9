"""sandboxd: sandboxed verifiers for RL post-training, served over gRPC."""

__version__ = "0.1.0"
