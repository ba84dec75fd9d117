"""The Nexmark generator: the same stream for a seed whatever the batching, the published
proportions and hot-key skew, fields of the right types and ranges, and JSON entries that decode
to exactly the generated rows. No Spark."""

from __future__ import annotations

import datetime as dt
import json
import re

import numpy as np
import pyarrow as pa
import pytest

from headrace.errors import InvalidInput
from headrace.nexmark import KINDS, SCHEMAS, Generator, GeneratorConfig, json_entries
from headrace.nexmark.generator import (
    ARROW_SCHEMAS,
    BASE_TIME_MS,
    BLOCK_EVENTS,
    HOT_CHANNELS,
    US_CITIES,
    US_STATES,
    event_kinds,
    iso_ms,
    last_auction_id,
    last_person_id,
    table_json,
)


@pytest.fixture(scope="module")
def stream():
    """120k events (crossing two block boundaries) at 1000 events/s."""
    return Generator(GeneratorConfig(seed=5, rate=1000)).events(0, 120_000)


def test_the_same_seed_gives_the_same_events_whatever_the_batching(stream):
    other = Generator(GeneratorConfig(seed=5, rate=1000))
    parts = list(other.batches(120_000, 7_777))  # batch edges fall inside blocks
    assert len(parts) == 16 and parts[-1].start == 15 * 7_777 and parts[-1].count == 3_345
    for kind in KINDS:
        joined = pa.concat_tables([p.tables[kind] for p in parts])
        assert joined.equals(stream.tables[kind]), kind
    # a range read on its own (not from 0) is the same rows again
    piece = Generator(GeneratorConfig(seed=5, rate=1000)).events(BLOCK_EVENTS - 10, 40)
    lo = int(np.searchsorted(stream.ids["bid"], BLOCK_EVENTS - 10))
    assert piece.tables["bid"].equals(stream.tables["bid"].slice(lo, piece.tables["bid"].num_rows))
    assert json_entries(piece) == json_entries(stream.slice(BLOCK_EVENTS - 10, BLOCK_EVENTS + 30))


def test_another_seed_gives_other_values_and_the_same_shape(stream):
    other = Generator(GeneratorConfig(seed=6, rate=1000)).events(0, 120_000)
    for kind in KINDS:
        assert other.tables[kind].num_rows == stream.tables[kind].num_rows
    assert not other.tables["bid"]["price"].equals(stream.tables["bid"]["price"])
    assert other.tables["person"]["id"].equals(stream.tables["person"]["id"])  # not random


def test_kinds_follow_the_1_3_46_proportions(stream):
    counts = {k: stream.tables[k].num_rows for k in KINDS}
    assert counts == {"person": 2_400, "auction": 7_200, "bid": 110_400}
    ids = np.arange(100)
    assert event_kinds(ids).tolist() == ([0] + [1] * 3 + [2] * 46) * 2
    for i, kind in enumerate(KINDS):
        assert (event_kinds(stream.ids[kind]) == i).all()


def test_ids_are_dense_and_times_advance_at_the_rate(stream):
    persons, auctions = stream.tables["person"], stream.tables["auction"]
    assert persons["id"].to_pylist() == list(range(1000, 1000 + persons.num_rows))
    assert auctions["id"].to_pylist() == list(range(1000, 1000 + auctions.num_rows))
    for kind in KINDS:
        ms = stream.tables[kind]["dateTime"].cast(pa.int64()).to_numpy()
        assert (ms == BASE_TIME_MS + stream.ids[kind] * 1000 // 1000).all(), kind
    # 10,000 events per second: ten events share each millisecond
    fast = Generator(GeneratorConfig(seed=5, rate=10_000)).events(0, 100)
    ms = fast.tables["bid"]["dateTime"].cast(pa.int64()).to_numpy() - BASE_TIME_MS
    assert (ms == fast.ids["bid"] // 10).all()
    assert last_person_id(np.array([0, 1, 49, 50, 51])).tolist() == [0, 0, 0, 1, 1]
    assert last_auction_id(np.array([0, 1, 3, 4, 50, 51])).tolist() == [-1, 0, 2, 2, 2, 3]


def test_hot_auctions_bidders_and_sellers_take_the_published_shares(stream):
    bids, auctions = stream.tables["bid"], stream.tables["auction"]
    auction = bids["auction"].to_numpy() - 1000
    bidder = bids["bidder"].to_numpy() - 1000
    seller = auctions["seller"].to_numpy() - 1000
    # hot: the first auction / second person / first person of the last batch of 100
    hot_auction = np.mean(auction % 100 == 0)
    hot_bidder = np.mean(bidder % 100 == 1)
    hot_seller = np.mean(seller % 100 == 0)
    # 1 - 1/ratio of the picks are hot, and 1 in 100 of the other (uniform) picks lands on one
    assert abs(hot_auction - (0.5 + 0.5 / 100)) < 0.01, hot_auction
    assert abs(hot_bidder - (0.75 + 0.25 / 100)) < 0.01, hot_bidder
    assert abs(hot_seller - (0.75 + 0.25 / 100)) < 0.02, hot_seller
    # skew: the most bid-on auction draws over 30x the bids of an average auction
    per_auction = np.bincount(auction)
    assert per_auction.max() > 30 * per_auction[per_auction > 0].mean()
    # the other picks stay among the in-flight auctions / active people (+10 ahead)
    last_a = last_auction_id(stream.ids["bid"])
    assert ((auction >= np.maximum(last_a - 100, 0)) & (auction <= last_a + 10)).all()
    last_p = last_person_id(stream.ids["bid"])
    assert ((bidder >= last_p - 999) & (bidder <= last_p + 10)).all()


def test_fields_have_the_schema_types_and_ranges(stream):
    for kind in KINDS:
        t = stream.tables[kind]
        assert t.schema == ARROW_SCHEMAS[kind]
        ddl = [(c.split()[0], c.split()[1]) for c in SCHEMAS[kind].split(", ")]
        assert [n for n, _ in ddl] == t.column_names
        assert all(t[c].null_count == 0 for c in t.column_names)
    p, a, b = (stream.tables[k].to_pydict() for k in KINDS)
    assert set(p["state"]) <= set(US_STATES) and set(p["city"]) <= set(US_CITIES)
    assert all(re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", c) for c in p["creditCard"])
    assert all(re.fullmatch(r"[a-z ]*@[a-z ]*\.com", e) for e in p["emailAddress"])
    assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", n) for n in p["name"])
    initial, reserve = np.array(a["initialBid"]), np.array(a["reserve"])
    assert initial.min() >= 100 and initial.max() <= 10**8 and (reserve > initial).all()
    assert set(a["category"]) == {10, 11, 12, 13, 14}
    assert all(e > d for e, d in zip(a["expires"], a["dateTime"], strict=True))
    assert max(map(len, a["description"])) == 99 and max(map(len, a["itemName"])) == 19
    assert not any(s != s.strip() for s in a["description"] + a["itemName"])
    price = np.array(b["price"])
    assert price.min() >= 100 and price.max() <= 10**8
    # prices are log-uniform: about a sixth of them in each decade
    decade = np.floor(np.log10(price / 100)).clip(0, 5)
    assert np.allclose(np.bincount(decade.astype(int)) / len(price), 1 / 6, atol=0.01)
    hot = np.isin(b["channel"], HOT_CHANNELS)
    assert abs(hot.mean() - 0.5) < 0.01
    assert all(re.fullmatch(r"channel-\d+", c) for c, h in zip(b["channel"], hot, strict=True)
               if not h)
    assert all(u.startswith("https://www.nexmark.com/") for u in b["url"])
    # extra pads a bid to ~100 idealised bytes (32 of fields): 68 +- 20% characters
    extra = np.array([len(x) for x in b["extra"]])
    assert extra.min() >= 54 and extra.max() <= 82 and abs(extra.mean() - 68) < 1


def test_json_entries_decode_to_the_generated_rows(stream):
    part = stream.slice(0, 2_000)
    entries = json_entries(part)
    assert len(entries) == 2_000
    decoded = [json.loads(e) for e in entries]
    assert [d["table"] for d in decoded] == [KINDS[k] for k in event_kinds(np.arange(2_000))]
    assert all(d["w"] == 1 for d in decoded)
    for kind in KINDS:
        rows = [{k: v for k, v in d.items() if k not in ("table", "w")} for d in decoded
                if d["table"] == kind]
        want = part.tables[kind].to_pylist()
        assert len(rows) == len(want)
        for got, row in zip(rows, want, strict=True):
            assert list(got) == list(row)
            for k, v in row.items():
                if isinstance(v, dt.datetime):
                    assert dt.datetime.fromisoformat(got[k]) == v, (kind, k)
                    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", got[k])
                else:
                    assert got[k] == v, (kind, k)


def test_json_strings_are_escaped():
    awkward = ['say "hi"', "back\\slash", "tab\tnewline\n", "nul\x00 unit\x1f", "é ✓"]
    t = pa.table({"s": pa.array(awkward), "n": pa.array([1, 2, 3, 4, 5], pa.int64())})
    out = [json.loads(e) for e in table_json("x", t).to_pylist()]
    assert [o["s"] for o in out] == awkward and [o["n"] for o in out] == [1, 2, 3, 4, 5]


def test_iso_timestamps_match_pythons_formatting():
    ms = np.random.default_rng(1).integers(-10**12, 10**13, 5_000)
    ms = np.concatenate([ms, [0, 951_868_799_999, 4_102_444_799_999]])  # leap day, 2099
    want = [(dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=int(x)))
            .strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" for x in ms]
    assert iso_ms(ms).to_pylist() == want
    with pytest.raises(InvalidInput, match="years"):
        iso_ms(np.array([-10**15]))


@pytest.mark.parametrize("bad", [dict(rate=0), dict(rate=2.5), dict(seed=-1), dict(seed="7"),
                                 dict(hot_auction_ratio=0), dict(num_active_people=True),
                                 dict(avg_bid_bytes=-1), dict(seed=2**63)])
def test_bad_configuration_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidInput, match=next(iter(bad))):
        GeneratorConfig(**bad)


def test_bad_ranges_are_refused():
    g = Generator(GeneratorConfig())
    with pytest.raises(InvalidInput, match="start"):
        g.events(-1, 5)
    with pytest.raises(InvalidInput, match="batch_events"):
        list(g.batches(10, 0))
    empty = g.events(10, 0)
    assert empty.count == 0 and json_entries(empty) == []
    assert all(empty.tables[k].schema == ARROW_SCHEMAS[k] for k in KINDS)
