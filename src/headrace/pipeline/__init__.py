"""The streaming pipeline engine: plan -> operators -> state -> runner.

- ``plan``: the user's fluent graph (PySpark-shaped) and its checks at definition time.
- ``operators``: incremental Z-set kernels (Arrow in, Arrow out), one interface, no Spark.
- ``state``: per (operator, side, bucket) an LSM of sorted, paged runs in the reservoir.
- ``runner``: one micro-batch on Spark — data stays on the executors, control rows to the driver.

Importing this package does not import pyspark.
"""
