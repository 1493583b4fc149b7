"""``jobsched token``: the role and scope it mints are the ones the gateway reads back."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from core.access import READ, SCOPES, Role
from gateway.auth import principal_from_token
from jobsched.cli import main
from tests.conftest import TEST_SECRET

ENV = {"JOBSCHED_AUTH_SECRET": TEST_SECRET}


def mint(*args: str) -> str:
    result = CliRunner().invoke(main, ["token", "--user", "alice", *args], env=ENV)
    assert result.exit_code == 0, result.output
    return result.output.strip()


def test_a_default_token_is_a_user_with_every_scope() -> None:
    who = principal_from_token(mint(), TEST_SECRET)
    assert (who.user, who.role, who.scopes) == ("alice", Role.USER, SCOPES)


def test_role_and_scope_are_minted_into_the_token() -> None:
    who = principal_from_token(mint("--role", "admin", "--scope", "jobs:read"), TEST_SECRET)
    assert (who.role, who.scopes) == (Role.ADMIN, frozenset({READ}))


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--role", "root"], "'root' is not one of"), (["--scope", "jobs:all"], "unknown scope")],
)
def test_an_unknown_role_or_scope_is_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["token", "--user", "alice", *args], env=ENV)
    assert result.exit_code == 2 and message in result.output
