"""The controller's pure bookkeeping: its block of job uids."""

from __future__ import annotations

import pytest

from sandboxd.agent.controller import UidPool
from sandboxd.agent.protocol import UIDS_PER_SANDBOX, UNSLOTTED_FIRST_UID, first_job_uid
from sandboxd.agent.runner import SandboxDamaged


def test_uids_come_from_the_placed_block_lowest_first_and_reused_last() -> None:
    uids = UidPool()
    uids.place(first_job_uid(31337))
    first = first_job_uid(31337)
    taken = [uids.take() for _ in range(3)]
    assert taken == [first, first + 1, first + 2]
    uids.give_back(first)
    assert [uids.take() for _ in range(UIDS_PER_SANDBOX - 2)][-1] == first  # after the 497 never taken


def test_the_block_runs_out_rather_than_spilling_into_another_sandboxes() -> None:
    uids = UidPool(first_job_uid(7))
    for _ in range(UIDS_PER_SANDBOX):
        assert first_job_uid(7) <= uids.take() < first_job_uid(8)
    with pytest.raises(SandboxDamaged, match="no free job uid"):
        uids.take()


def test_the_block_moves_only_while_no_uid_is_taken() -> None:
    uids = UidPool()
    assert uids.take() == UNSLOTTED_FIRST_UID
    uids.place(UNSLOTTED_FIRST_UID)  # the same block again (a repeated hello): nothing to move
    with pytest.raises(SandboxDamaged, match="while 1 are taken"):
        uids.place(first_job_uid(99))
    uids.give_back(UNSLOTTED_FIRST_UID)
    uids.place(first_job_uid(99))
    assert uids.take() == first_job_uid(99)
