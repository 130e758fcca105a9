"""Client for sandboxd: sync and async gRPC clients and trainer integrations."""

__version__ = "0.1.0"
