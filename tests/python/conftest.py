"""One local ringfs cluster for the whole session (stopped at the end, also on failure), and a
fresh directory in it for each test."""

import os
import uuid

import pytest

import ringfs


@pytest.fixture(scope="session")
def cluster():
    with ringfs.Cluster(servers=2) as running:
        saved = {name: os.environ.get(name) for name in running.environ}
        # fsspec's ringfs:// (pandas, pyarrow, zarr URLs) connects as the environment says.
        os.environ.update(running.environ)
        try:
            yield running
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="session")
def client(cluster):
    return cluster.client()


@pytest.fixture
def root(client):
    """A directory of this test's own."""
    path = f"/test-{uuid.uuid4().hex[:12]}"
    client.mkdir(path)
    yield path
    client.rmtree(path)


@pytest.fixture
def fs(cluster):
    from ringfs.fsspec import RingFileSystem

    return RingFileSystem()
