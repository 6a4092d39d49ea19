"""Fixtures for the client's tests: the servers come from the environment.

``cargo test --test all python_client::`` (tests/all/python_client.rs) starts them and sets
``MEMBER_URL`` (a standalone server) or ``MEMBER_CLUSTER_PORT`` (a node of a cluster). A test
whose server is not given fails: nothing is skipped in silence.
"""

import os

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
