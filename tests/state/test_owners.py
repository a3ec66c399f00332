"""FrontendOwners: one owner per frontend, the claimant whose claim is the
oldest (ties in one Sync by service port name), kept for as long as it claims
the frontend, handed over in the Sync it stops."""

from __future__ import annotations

from ipaddress import ip_address

from kpng_py.model import Frontend, Protocol, ServicePortName
from kpng_py.state.owners import FrontendOwners

VIP = Frontend(ip_address("10.96.0.10"), 80, Protocol.TCP)
OTHER = Frontend(ip_address("10.96.0.11"), 80, Protocol.TCP)


def name(service: str) -> ServicePortName:
    return ServicePortName("default", service, "http", Protocol.TCP)


A, B, C = name("a"), name("b"), name("c")


def test_in_one_sync_the_first_by_name_owns_whatever_the_claim_order() -> None:
    owners = FrontendOwners()
    assert owners.update({C: (VIP,), A: (VIP,), B: (VIP,)}) == set()
    assert owners.owner(VIP) == A


def test_the_oldest_claim_wins_over_a_smaller_name() -> None:
    owners = FrontendOwners()
    owners.update({B: (VIP,)})
    owners.update({A: (VIP,)})
    assert owners.owner(VIP) == B


def test_an_owner_that_stops_claiming_hands_over_to_the_oldest_waiting_claim() -> None:
    owners = FrontendOwners()
    owners.update({A: (VIP,)})
    owners.update({C: (VIP,)})
    owners.update({B: (VIP,)})
    assert owners.update({A: ()}) == {C}
    assert owners.owner(VIP) == C


def test_a_port_changed_in_the_same_sync_is_not_reported_as_taking_over() -> None:
    owners = FrontendOwners()
    owners.update({A: (VIP,), B: (VIP, OTHER)})
    assert owners.update({A: (OTHER,), B: (VIP, OTHER)}) == set()
    assert (owners.owner(VIP), owners.owner(OTHER)) == (B, B)


def test_a_claimant_that_stops_waiting_never_owns() -> None:
    owners = FrontendOwners()
    owners.update({A: (VIP,), B: (VIP,)})
    owners.update({B: ()})
    assert owners.update({A: ()}) == set()
    assert owners.owner(VIP) is None


def test_an_owner_keeps_its_frontend_whatever_else_it_claims() -> None:
    owners = FrontendOwners()
    owners.update({B: (VIP,)})
    owners.update({A: (VIP,)})
    owners.update({B: (VIP, OTHER)})
    assert (owners.owner(VIP), owners.owner(OTHER)) == (B, B)
