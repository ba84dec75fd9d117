"""Test support shipped with the package: conformance suites and real test servers.

Nothing here replaces the thing under test: the S3 server is moto's real HTTP endpoint, the Spark
session is real PySpark. FaultyStore (headrace.store) is the only fault-injection wrapper.
"""
