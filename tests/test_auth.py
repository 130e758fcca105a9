"""Bearer tokens: the tokens file, which role may call what, and the interceptor's decisions."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from sandboxd import auth
from sandboxd.errors import ConfigError

JOBS_SECRET = "j" * 32
ADMIN_SECRET = "a" * 32
TOKENS = [auth.Token("trainer", "jobs", JOBS_SECRET.encode()), auth.Token("ops", "admin", ADMIN_SECRET.encode())]


def write_tokens(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_load_tokens(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "tokens", f"# name role token\ntrainer jobs {JOBS_SECRET}\n\n"
                                             f"ops  admin\t{ADMIN_SECRET}  # on call\n")
    assert auth.load_tokens(path) == TOKENS


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o660, 0o644])
def test_tokens_file_open_to_others_refused(tmp_path: Path, mode: int) -> None:
    path = write_tokens(tmp_path / "tokens", f"trainer jobs {JOBS_SECRET}\n", mode)
    with pytest.raises(ConfigError, match=rf"server\.tokens_file .*: mode {mode:04o} lets group or others in"):
        auth.load_tokens(path)


def test_tokens_file_missing_or_a_link(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.tokens_file .*No such file"):
        auth.load_tokens(str(tmp_path / "none"))
    target = write_tokens(tmp_path / "tokens", f"trainer jobs {JOBS_SECRET}\n")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match=r"server\.tokens_file"):
        auth.load_tokens(str(tmp_path / "link"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "no tokens"),
        ("# only a comment\n", "no tokens"),
        (f"trainer {JOBS_SECRET}\n", "line 1: expected 'name role token', got 2 fields"),
        (f"trainer root {JOBS_SECRET}\n", "line 1: role must be jobs or admin, got 'root'"),
        ("trainer jobs short\n", "line 1: token 'trainer' must be at least 16"),
        (f"a jobs {JOBS_SECRET}\na admin {ADMIN_SECRET}\n", "line 2: token name 'a' is used twice"),
        (f"a jobs {JOBS_SECRET}\nb admin {JOBS_SECRET}\n", "line 2: token 'b' repeats another's token"),
    ],
)
def test_bad_tokens_file(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        auth.parse_tokens(text, "server.tokens_file /t")
    assert fragment in str(caught.value)
    # A token is never quoted back: error messages reach logs.
    assert JOBS_SECRET not in str(caught.value) and ADMIN_SECRET not in str(caught.value)


def test_token_repr_hides_the_secret() -> None:
    assert JOBS_SECRET not in repr(TOKENS[0]) and JOBS_SECRET not in str(TOKENS)


@pytest.mark.parametrize(
    ("method", "role"),
    [
        ("/grpc.health.v1.Health/Check", None),
        ("/grpc.health.v1.Health/Watch", None),
        ("/sandboxd.v1.Jobs/Run", "jobs"),
        ("/sandboxd.v1.Jobs/RunBatch", "jobs"),
        ("/sandboxd.v1.Sessions/Open", "jobs"),
        ("/sandboxd.v1.Pool/GetStatus", "jobs"),
        ("/sandboxd.v1.Daemon/GetInfo", "jobs"),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "jobs"),
        ("/sandboxd.v1.Pool/SetBatchHint", "admin"),
        # Pool controls added later are closed to jobs tokens until named.
        ("/sandboxd.v1.Pool/Drain", "admin"),
        ("/sandboxd.v1.Daemon/Shutdown", "admin"),
        ("/sandboxd.v1.Pool/GetStatusAndMore", "admin"),
    ],
)
def test_required_role(method: str, role: str | None) -> None:
    assert auth.required_role(method) == role


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), None),
        ((("authorization", f"Bearer {JOBS_SECRET}"),), JOBS_SECRET.encode()),
        ((("authorization", f"bearer  {JOBS_SECRET} "),), JOBS_SECRET.encode()),
        ((("x-other", "1"), ("authorization", f"Bearer {JOBS_SECRET}")), JOBS_SECRET.encode()),
        ((("authorization", JOBS_SECRET),), None),
        ((("authorization", f"Basic {JOBS_SECRET}"),), None),
        ((("authorization", "Bearer "),), None),
    ],
)
def test_bearer(metadata: tuple[tuple[str, str], ...], expected: bytes | None) -> None:
    assert auth.bearer(metadata) == expected


@pytest.mark.parametrize(
    ("method", "secret", "token", "refused"),
    [
        ("/grpc.health.v1.Health/Check", None, None, None),
        ("/sandboxd.v1.Jobs/RunBatch", None, None, grpc.StatusCode.UNAUTHENTICATED),
        ("/sandboxd.v1.Jobs/RunBatch", "x" * 32, None, grpc.StatusCode.UNAUTHENTICATED),
        # A prefix or an extension of a real token is not that token.
        ("/sandboxd.v1.Jobs/RunBatch", JOBS_SECRET[:-1], None, grpc.StatusCode.UNAUTHENTICATED),
        ("/sandboxd.v1.Jobs/RunBatch", JOBS_SECRET + "j", None, grpc.StatusCode.UNAUTHENTICATED),
        ("/sandboxd.v1.Jobs/RunBatch", JOBS_SECRET, "trainer", None),
        ("/sandboxd.v1.Jobs/RunBatch", ADMIN_SECRET, "ops", None),
        ("/sandboxd.v1.Pool/SetBatchHint", JOBS_SECRET, "trainer", grpc.StatusCode.PERMISSION_DENIED),
        ("/sandboxd.v1.Pool/SetBatchHint", ADMIN_SECRET, "ops", None),
        ("/sandboxd.v1.Pool/SetBatchHint", None, None, grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_authorize(method: str, secret: str | None, token: str | None, refused: grpc.StatusCode | None) -> None:
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    found, code = auth.authorize(TOKENS, method, metadata)
    assert (found.name if found else None, code) == (token, refused)
