"""Client for sandboxd: sync and async gRPC clients and trainer integrations.

``SandboxClient`` / ``AsyncSandboxClient`` talk to one daemon or balance over
several; ``code_job``, ``math_job``, ``execute_job`` and ``reward_model_job``
build the jobs they run. The TRL and verl helpers live in
``sandboxd_client.trl`` and ``sandboxd_client.verl``.
"""

from ._core import DEFAULT_ADDRESS, RetryPolicy, reward_model_health_service
from ._requests import (
    CellResult,
    CodeDetail,
    ExecuteOutput,
    FunctionCase,
    Limit,
    MathDetail,
    Result,
    RewardModelDetail,
    Status,
    StdioCase,
    TestResult,
    Timings,
    code_job,
    code_tests,
    execute_job,
    job_from_row,
    math_job,
    reward_model_job,
)
from .client import AsyncSandboxClient, AsyncSession, SandboxClient, Session
from .errors import (
    Cancelled,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    MessageTooLarge,
    Overloaded,
    PermissionDenied,
    SandboxdError,
    SessionNotFound,
    Unavailable,
    Unimplemented,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ADDRESS",
    "AsyncSandboxClient",
    "AsyncSession",
    "Cancelled",
    "CellResult",
    "CodeDetail",
    "DeadlineExceeded",
    "ExecuteOutput",
    "FunctionCase",
    "InternalError",
    "InvalidRequest",
    "Limit",
    "MathDetail",
    "MessageTooLarge",
    "Overloaded",
    "PermissionDenied",
    "Result",
    "RetryPolicy",
    "RewardModelDetail",
    "SandboxClient",
    "SandboxdError",
    "Session",
    "SessionNotFound",
    "Status",
    "StdioCase",
    "TestResult",
    "Timings",
    "Unavailable",
    "Unimplemented",
    "__version__",
    "code_job",
    "code_tests",
    "execute_job",
    "job_from_row",
    "math_job",
    "reward_model_health_service",
    "reward_model_job",
]
