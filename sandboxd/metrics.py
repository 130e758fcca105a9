"""Prometheus metrics, in base units, served over HTTP by prometheus_client."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sandboxd.config import split_address

REGISTRY = CollectorRegistry()

JOBS = Counter("sandboxd_jobs", "Jobs answered, by kind and status", ["kind", "status"], registry=REGISTRY)
JOB_SECONDS = Histogram(
    "sandboxd_job_duration_seconds", "Admission to answer", ["kind"], registry=REGISTRY,
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
RETRIES = Counter("sandboxd_job_retries", "Jobs retried on another sandbox after a sandbox loss",
                  registry=REGISTRY)
REJECTED = Counter("sandboxd_admission_rejected", "Requests refused with RESOURCE_EXHAUSTED",
                   registry=REGISTRY)
ABANDONED = Counter("sandboxd_jobs_abandoned", "Jobs whose caller gave up (deadline, cancel) while they ran; "
                    "each is withdrawn from its sandbox, whose slot comes back when the agent answers", ["kind"],
                    registry=REGISTRY)
QUEUE_DEPTH = Gauge("sandboxd_queue_depth", "Jobs admitted, waiting for a sandbox", registry=REGISTRY)
IN_FLIGHT = Gauge("sandboxd_jobs_in_flight", "Jobs running in sandboxes", registry=REGISTRY)
SANDBOXES = Gauge("sandboxd_sandboxes", "Sandboxes by pool and state", ["pool", "state"], registry=REGISTRY)
SANDBOX_STARTS = Counter("sandboxd_sandbox_starts", "Sandboxes started, by method (restore or cold)",
                         ["pool", "method"], registry=REGISTRY)
SANDBOX_START_FAILURES = Counter("sandboxd_sandbox_start_failures", "Sandbox starts that failed, by pool "
                                 "(the pool status says why; several in a row with none ready: the pool is failing)",
                                 ["pool"], registry=REGISTRY)
POOL_FAILING = Gauge("sandboxd_pool_failing", "1 while the pool cannot start sandboxes (its starts failed in a "
                     "row and none is ready): its jobs are answered SANDBOX_LOST at once", ["pool"], registry=REGISTRY)
SANDBOX_READY_SECONDS = Gauge("sandboxd_sandbox_ready_seconds", "Last start-to-ready time by method",
                              ["pool", "method"], registry=REGISTRY)
SNAPSHOT_READY = Gauge("sandboxd_snapshot_ready", "1 when the pool's snapshot is ready to restore from", ["pool"],
                       registry=REGISTRY)
POOL_RESTORING = Gauge("sandboxd_pool_restoring", "1 when the pool starts sandboxes by restoring its snapshot, "
                       "0 when it cold-starts them (pool.restore = auto: cold starts were quicker)", ["pool"],
                       registry=REGISTRY)

SESSIONS_OPEN = Gauge("sandboxd_sessions_open", "Sessions open now", registry=REGISTRY)
SESSION_CELLS = Counter("sandboxd_session_cells", "Session cells answered, by language and status",
                        ["language", "status"], registry=REGISTRY)
SESSIONS_ENDED = Counter("sandboxd_sessions_ended", "Sessions ended, by reason (closed, idle, lifetime, "
                         "max_cells, died, sandbox_lost, shutdown)", ["reason"], registry=REGISTRY)
AUTH_CALLS = Counter("sandboxd_auth_calls", "Calls on the TCP listener by token name (\"\" when no token "
                     "matched) and result (ok, unauthenticated, permission_denied)", ["token", "result"],
                     registry=REGISTRY)


def serve(address: str) -> None:
    """Start the HTTP endpoint; `address` is host:port."""
    host, port = split_address(address)
    start_http_server(port, addr=host, registry=REGISTRY)
