"""Public job builders: plain Python values in, ``sandboxd.v1.Job`` out, validated before any RPC."""

from ._requests import (
    CodeTestsLike,
    FunctionCase,
    StdioCase,
    code_job,
    code_tests,
    execute_job,
    ignored_row_options,
    job_from_row,
    math_job,
    reward_model_job,
    validate_batch,
    validate_job,
)

__all__ = [
    "CodeTestsLike",
    "FunctionCase",
    "StdioCase",
    "code_job",
    "code_tests",
    "execute_job",
    "ignored_row_options",
    "job_from_row",
    "math_job",
    "reward_model_job",
    "validate_batch",
    "validate_job",
]
