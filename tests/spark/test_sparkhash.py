"""headrace.pipeline.encoding.sparkhash against Spark's own xxhash64: the bucket of every value a key
may hold must be the one Spark's plan computes, or a restart's direct batch (driver/direct_job.py) would
put a key in another bucket than its state."""

from __future__ import annotations

import datetime as dt
import math
import random

import numpy as np
import pyarrow as pa
import pytest

from headrace.pipeline.encoding import sparkhash

pytestmark = pytest.mark.spark


def _values(rng: random.Random, n: int) -> dict[str, list]:
    def maybe(v):
        return None if rng.random() < 0.1 else v

    alphabet = "ab\u00e9\u4e2d\U0001f600 "
    floats = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, -2.25, 1e308, 5e-324]
    return {
        "b": [maybe(rng.random() < 0.5) for _ in range(n)],
        "i": [maybe(rng.choice([0, -1, 2**31 - 1, -2**31, rng.randint(-1000, 1000)]))
              for _ in range(n)],
        "l": [maybe(rng.choice([0, -1, 2**63 - 1, -2**63, rng.getrandbits(63)]))
              for _ in range(n)],
        "f": [maybe(rng.choice(floats + [rng.uniform(-1e6, 1e6)])) for _ in range(n)],
        "d": [maybe(rng.choice(floats + [rng.uniform(-1e9, 1e9)])) for _ in range(n)],
        # every length 0..100 (the 4-byte tail, the 1-byte tail, the 32-byte stripes)
        "s": [maybe("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))))
              for _ in range(n)],
        "x": [maybe(bytes(rng.getrandbits(8) for _ in range(k % 101))) for k in range(n)],
        "dt": [maybe(dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-30000, 30000)))
               for _ in range(n)],
        "ts": [maybe(dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
                     + dt.timedelta(microseconds=rng.getrandbits(40)))
               for _ in range(n)],
    }


def test_xxhash64_equals_sparks_for_every_supported_type(spark):
    from pyspark.sql import functions as F

    n = 600
    values = _values(random.Random(7), n)
    types = {"b": pa.bool_(), "i": pa.int32(), "l": pa.int64(), "f": pa.float32(),
             "d": pa.float64(), "s": pa.string(), "x": pa.binary(), "dt": pa.date32(),
             "ts": pa.timestamp("us", tz="UTC")}
    table = pa.table({c: pa.array(v, types[c]) for c, v in values.items()})
    df = spark.createDataFrame(table)
    combos = [[c] for c in types] + [["l", "s"], ["s", "i", "d"], list(types)]
    got = df.select(*[F.xxhash64(*cols).alias("h_" + "+".join(cols)) for cols in combos],
                    *types).toArrow()
    for cols in combos:
        mine = sparkhash.xxhash64([got[c] for c in cols], got.num_rows)
        spark_says = got["h_" + "+".join(cols)].to_numpy()
        bad = np.flatnonzero(mine != spark_says)
        assert not len(bad), (cols, [got[c][int(bad[0])] for c in cols])
    buckets = sparkhash.buckets([got["l"], got["s"]], got.num_rows, 32)
    spark_buckets = df.select(F.pmod(F.xxhash64("l", "s"), F.lit(32)).cast("int")).toArrow()
    assert buckets.tolist() == spark_buckets.column(0).to_pylist()


def test_unsupported_types_are_refused():
    assert not sparkhash.supported(pa.decimal128(10, 2))
    assert not sparkhash.supported(pa.timestamp("ms"))
    with pytest.raises(TypeError, match="decimal"):
        sparkhash.xxhash64([pa.array([1], pa.decimal128(10, 2))], 1)
