from __future__ import annotations

from typing import Callable, Iterator

import pytest

from lab.proxy_node import ClientAgent, ClientNodeServer, NodeBackend, cluster, node_starter
from tests.support.kernel import require_root


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[ClientNodeServer]:
    require_root()
    with cluster() as the_cluster:
        yield the_cluster


@pytest.fixture
def start_node(netns_cluster: ClientNodeServer) -> Iterator[Callable[..., NodeBackend]]:
    """Starts the backend in the node namespace with the given flags."""
    with node_starter(netns_cluster) as start:
        yield start


@pytest.fixture
def client(netns_cluster: ClientNodeServer) -> Iterator[ClientAgent]:
    agent = ClientAgent(netns_cluster)
    yield agent
    agent.close()
