"""The `fleet-model` benchmark's parts (bench/fleet_model.py): its stand-in daemons' model, and the spread logic
with the real client balancing over 8 stand-ins (TLS and a token, as the benchmark runs them)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from sandboxd_client import PermissionDenied, SandboxClient, execute_job

from bench import tls
from bench.fleet_model import NodeModel, StandIn, StandInFleet, Tls, spread, tally


def test_spread_of_counts() -> None:
    even = spread([5, 5, 5, 5])
    assert (even["jobs"], even["min"], even["max"], even["max_over_min"], even["cv"], even["idle"]) == (
        20, 5, 5, 1.0, 0.0, 0)
    uneven = spread([2, 4, 6, 8])
    assert uneven["max_over_min"] == 4.0
    assert uneven["cv"] == pytest.approx(math.sqrt(5) / 5)  # stdev sqrt(5) over mean 5
    one_idle = spread([0, 3, 3])
    assert (one_idle["idle"], one_idle["max_over_min"]) == (1, math.inf)
    with pytest.raises(ValueError):
        spread([])


def test_a_stand_in_queues_jobs_on_its_slots() -> None:
    stand_in = StandIn("s", NodeModel(slots=2, service_seconds=1.0))
    # Five jobs on two slots at t=10: two finish at 11, two at 12, the last at 13.
    assert stand_in.admit(5, now=10.0) == [11.0, 11.0, 12.0, 12.0, 13.0]
    # Two arriving at 12.5: the first on the slot idle since 12, the second waits for the one free at 13.
    assert stand_in.admit(2, now=12.5) == [13.5, 14.0]
    # Idle slots start a late arrival at once.
    assert stand_in.admit(2, now=100.0) == [101.0, 101.0]


@pytest.fixture(scope="module")
def door() -> Iterator[tls.Door]:
    made = tls.make_door()
    yield made
    made.remove()


@pytest.fixture(scope="module")
def fleet(door: tls.Door) -> Iterator[StandInFleet]:
    with StandInFleet(8, NodeModel(slots=4, service_seconds=0.001), tls=Tls(door.folder / "server.pem",
                      door.folder / "server.key"), token=door.token) as running:
        yield running


def _client(fleet: StandInFleet, door: tls.Door, token: str | None, **options: Any) -> SandboxClient:
    # gRPC checks every daemon of an address list against one name, the list's own unless told: the certificate's.
    return SandboxClient(fleet.addresses, token=token, tls_ca=str(door.folder / "ca.pem"),
                         tls_server_name="127.0.0.1", **options)


def test_the_client_spreads_a_batch_over_every_stand_in(fleet: StandInFleet, door: tls.Door) -> None:
    names = [stand_in.name for stand_in in fleet.stand_ins]
    job = execute_job("print(1)", timeout=10)
    with _client(fleet, door, door.token, batch_size=8) as client:
        # round_robin sends only to daemons it is connected to: the benchmark warms up until each has answered.
        counts = [0]
        for _ in range(20):
            counts = tally(client.score_batch([job] * 64), names)
            if all(counts):
                break
        before = [stand_in.answered for stand_in in fleet.stand_ins]
        results = client.score_batch([job] * 256)  # 32 RunBatch streams of 8
    assert [r.index for r in results] == list(range(256))
    assert all(r.ok and r.reward == 1.0 for r in results)
    counts = tally(results, names)
    assert counts == [s.answered - b for s, b in zip(fleet.stand_ins, before, strict=True)]
    stats = spread(counts)
    assert stats["jobs"] == 256 and stats["idle"] == 0, counts
    assert stats["max_over_min"] == max(counts) / min(counts)


def test_a_stand_in_refuses_a_missing_token(fleet: StandInFleet, door: tls.Door,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOXD_TOKEN", raising=False)
    before = sum(stand_in.answered for stand_in in fleet.stand_ins)
    with _client(fleet, door, None, max_retries=0) as client, pytest.raises(PermissionDenied) as refused:
        client.run(execute_job("print(1)", timeout=10))
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert sum(stand_in.answered for stand_in in fleet.stand_ins) == before
