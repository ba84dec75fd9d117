"""Session-wide fixtures: one moto S3 server and one SparkSession for the whole test run."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def moto_server():
    from headrace.testing.s3server import MotoS3

    server = MotoS3()
    yield server
    server.stop()


@pytest.fixture
def s3_url(moto_server) -> str:
    """An s3:// URL for a fresh, empty bucket on the moto server."""
    return moto_server.new_bucket()


@pytest.fixture(scope="session")
def spark():
    from headrace.testing.spark import local_spark

    session = local_spark()
    yield session
    session.stop()
