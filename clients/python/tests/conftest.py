"""Fixtures for the client's tests: the servers come from the environment.

``cargo test --test all python_client::`` (tests/all/python_client.rs) starts them and sets
``MEMBER_URL`` (a standalone server), ``MEMBER_CLUSTER_PORT`` (a node of a cluster) or
``MEMBER_CLUSTER_PORTS`` (every node of a cluster the test may count errors on). A test whose
server is not given fails: nothing is skipped in silence.
"""

import os
from urllib.parse import urlparse

import pytest
import redis

import libmember


def need(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.fail(
            f"{var} is not set: run these tests through `cargo test --test all "
            "python_client::`, which starts the servers"
        )
    return value


@pytest.fixture
def url() -> str:
    return need("MEMBER_URL")


@pytest.fixture
def r(url):
    client = redis.Redis.from_url(url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def sets(r) -> libmember.Sets:
    return libmember.Sets(r)


@pytest.fixture
def cluster_port() -> int:
    return int(need("MEMBER_CLUSTER_PORT"))


@pytest.fixture
def address(url):
    """(host, port) of the standalone server, for clients that take no URL (GLIDE)."""
    parsed = urlparse(url)
    return parsed.hostname, parsed.port


@pytest.fixture
def cluster_ports() -> list:
    return [int(p) for p in need("MEMBER_CLUSTER_PORTS").split(",")]
