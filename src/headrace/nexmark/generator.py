"""A deterministic, vectorised generator of the Nexmark event stream.

It follows the semantics of the published generator (Apache Beam's ``sdks/java/testing/nexmark``
and the Flink ``nexmark`` project it was ported to) — written here with numpy and Arrow, one
array operation per field and block, never a Python loop per event:

* **Event ids and kinds.** Event ``n`` (0-based) is a person, an auction or a bid by
  ``n mod 50``: 0 -> person, 1..3 -> auction, 4..49 -> bid (the 1:3:46 proportions).
* **Ids.** Person and auction ids are dense and increasing from 1000: the person of event ``n``
  gets ``n // 50 + 1000``, the auctions of the epoch ``3 (n // 50) + (n mod 50 - 1) + 1000``.
* **Hot keys.** An auction's seller is a *hot seller* with probability ``1 - 1/hot_sellers_ratio``
  (the first person of the last batch of 100 people), else one of the last ``num_active_people``
  people (plus up to 10 not created yet). A bid's auction is *hot* with probability
  ``1 - 1/hot_auction_ratio`` (the first auction of the last batch of 100), else one of the last
  ``num_in_flight_auctions`` auctions (+10 ahead); its bidder is *hot* with probability
  ``1 - 1/hot_bidders_ratio`` (the second person of the last 100), else an active person.
  Defaults are the published ones: 2, 4, 4, 1000 active people, 100 auctions in flight.
* **Event time.** ``dateTime`` of event ``n`` is ``base_time + floor(n * 1000 / rate)`` ms: a
  steady ``rate`` events per second of event time from a fixed base (Beam's synthetic base,
  2015-07-15T00:00:00Z), so every run sees the same stream. Events come in event-time order.
* **Fields.** Prices are ``round(10^(6u) * 100)`` (log-uniform in [100, 10^8]); a reserve is the
  initial bid plus another price; ``expires`` is ``dateTime + 1 + uniform[0, 2h)`` ms, ``h`` the
  event time until 100 more auctions exist; categories 10..14; names, cities and states from
  the published lists; random strings of ``[a-z ]``; bids carry a channel (half of them one of 4
  hot channels) and its URL; ``extra`` pads each event to the published average byte sizes.

Randomness is drawn per block of ``BLOCK_EVENTS`` events from a generator seeded with
``(seed, block, kind)``, so an event's fields depend only on the seed and its id: any range of
events, cut into batches of any size, is the same stream. The values are not bit-for-bit those
of the Java generator (it draws from ``java.util.Random`` per event); the distributions are.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidInput

PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10  # ids ahead of the last created one a random pick may name
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = 100  # a hot seller/bidder/auction is one of every 100 ids
HOT_BIDDER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
BASE_TIME_MS = 1_436_918_400_000  # 2015-07-15T00:00:00Z, Beam's deterministic base time
BLOCK_EVENTS = 1000 * PROPORTION_DENOMINATOR  # randomness is drawn per block of this many
MIN_STRING_LENGTH = 3

KINDS = ("person", "auction", "bid")
SCHEMAS = {  # Spark DDL of each table, as read_queue takes it
    "person": "id long, name string, emailAddress string, creditCard string, city string, "
              "state string, dateTime timestamp, extra string",
    "auction": "id long, itemName string, description string, initialBid long, reserve long, "
               "dateTime timestamp, expires timestamp, seller long, category long, extra string",
    "bid": "auction long, bidder long, price long, channel string, url string, "
           "dateTime timestamp, extra string",
}
_TS = pa.timestamp("ms", tz="UTC")
_ARROW_TYPES = {"long": pa.int64(), "string": pa.string(), "timestamp": _TS}
ARROW_SCHEMAS = {kind: pa.schema([(name, _ARROW_TYPES[t]) for name, t in
                                  (c.strip().split() for c in ddl.split(","))])
                 for kind, ddl in SCHEMAS.items()}


@dataclass(frozen=True)
class GeneratorConfig:
    """What shapes the stream; the defaults are the published generator's."""

    seed: int = 0
    rate: int = 10_000  # events per second of event time
    base_time_ms: int = BASE_TIME_MS
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InvalidInput(f"nexmark {name}: must be an integer, got {value!r}")
            low = 0 if name in ("seed", "base_time_ms") or name.startswith("avg_") else 1
            if value < low:
                raise InvalidInput(f"nexmark {name}: must be >= {low}, got {value}")
        if self.seed >= 1 << 63:
            raise InvalidInput(f"nexmark seed: must be < 2**63, got {self.seed}")


# ---------------------------------------------------------------------------- ids and times

def event_kinds(ids: np.ndarray) -> np.ndarray:
    """0 = person, 1 = auction, 2 = bid, for each event id."""
    off = ids % PROPORTION_DENOMINATOR
    return np.where(off < PERSON_PROPORTION, 0,
                    np.where(off < PERSON_PROPORTION + AUCTION_PROPORTION, 1, 2)).astype(np.int8)


def event_times_ms(cfg: GeneratorConfig, ids: np.ndarray) -> np.ndarray:
    """Event time (ms since the epoch) of each event: ``rate`` events per second from the base."""
    return cfg.base_time_ms + (ids * 1000) // cfg.rate


def last_person_id(ids: np.ndarray) -> np.ndarray:
    """The last person id (base 0) created at or before each event."""
    epoch, off = np.divmod(ids, PROPORTION_DENOMINATOR)
    return epoch * PERSON_PROPORTION + np.minimum(off, PERSON_PROPORTION - 1)


def last_auction_id(ids: np.ndarray) -> np.ndarray:
    """The last auction id (base 0) created at or before each event (-1 before the first)."""
    epoch, off = np.divmod(ids, PROPORTION_DENOMINATOR)
    person = off < PERSON_PROPORTION
    bid = off >= PERSON_PROPORTION + AUCTION_PROPORTION
    off = np.where(person | bid, AUCTION_PROPORTION - 1, off - PERSON_PROPORTION)
    return (epoch - person) * AUCTION_PROPORTION + off


def _random_person(rng: np.random.Generator, ids: np.ndarray, cfg: GeneratorConfig):
    """One of the last ``num_active_people`` people, or up to 10 ids past the last one."""
    people = last_person_id(ids) + 1
    active = np.minimum(people, cfg.num_active_people)
    return people - active + rng.integers(0, active + PERSON_ID_LEAD)


def _random_auction(rng: np.random.Generator, ids: np.ndarray, cfg: GeneratorConfig):
    """One of the auctions likely still in flight, or up to 10 ids past the last one."""
    last = last_auction_id(ids)
    low = np.maximum(last - cfg.num_in_flight_auctions, 0)
    return low + rng.integers(0, last - low + 1 + AUCTION_ID_LEAD)


def _hot(rng: np.random.Generator, n: int, ratio: int) -> np.ndarray:
    """True with probability 1 - 1/ratio (Java's ``nextInt(ratio) > 0``)."""
    return rng.integers(0, ratio, n) > 0


def _prices(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)


# ---------------------------------------------------------------------------------- strings

def _from_bytes(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(lengths), pa.py_buffer(offsets),
                                            pa.py_buffer(data)).cast(pa.string())


def _strings(rng: np.random.Generator, n: int, max_len: int, special: str = " ") -> pa.Array:
    """Strings of 3..max_len-1 characters ``[a-z]``, one in 13 ``special``; a space is trimmed."""
    lengths = MIN_STRING_LENGTH + rng.integers(0, max_len - MIN_STRING_LENGTH, n)
    total = int(lengths.sum())
    data = rng.integers(ord("a"), ord("z") + 1, total, dtype=np.uint8)
    data[rng.integers(0, 13, total) == 0] = ord(special)
    out = _from_bytes(lengths, data)
    return pc.utf8_trim(out, characters=" ") if special == " " else out


def _exact_strings(rng: np.random.Generator, lengths: np.ndarray) -> pa.Array:
    total = int(lengths.sum())
    return _from_bytes(lengths, rng.integers(ord("a"), ord("z") + 1, total, dtype=np.uint8))


def _extra(rng: np.random.Generator, current: np.ndarray, average: int) -> pa.Array:
    """Padding so that ``current + len(extra)`` averages ``average`` (empty when already past)."""
    desired = average - current
    delta = np.floor(desired * 0.2 + 0.5).astype(np.int64)
    size = desired - delta + rng.integers(0, np.maximum(2 * delta, 1))
    return _exact_strings(rng, np.where(current > average, 0, np.maximum(size, 0)))


def _lengths(arr: pa.Array) -> np.ndarray:
    return pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)


def _pick(rng: np.random.Generator, values: tuple[str, ...], n: int) -> pa.Array:
    return pa.array(values).take(pa.array(rng.integers(0, len(values), n)))


def _credit_cards(rng: np.random.Generator, n: int) -> pa.Array:
    """Four groups of four digits separated by spaces ("%04d %04d %04d %04d")."""
    groups = rng.integers(0, 10_000, (n, 4))
    digits = (groups[:, :, None] // np.array([1000, 100, 10, 1])) % 10 + ord("0")
    chars = np.full((n, 4, 5), ord(" "), dtype=np.uint8)
    chars[:, :, :4] = digits
    return _from_bytes(np.full(n, 19), chars.reshape(n, 20)[:, :19].reshape(-1))


def _reverse_bits32(x: np.ndarray) -> np.ndarray:
    """Java's ``Integer.reverse`` on non-negative ints, as the absolute value of the result."""
    x = x.astype(np.uint32)
    for shift, mask in ((1, 0x55555555), (2, 0x33333333), (4, 0x0F0F0F0F), (8, 0x00FF00FF)):
        m = np.uint32(mask)
        x = ((x >> np.uint32(shift)) & m) | ((x & m) << np.uint32(shift))
    x = (x >> np.uint32(16)) | (x << np.uint32(16))
    return np.abs(x.view(np.int32).astype(np.int64))


def _channel_table(seed: int) -> tuple[pa.Array, pa.Array]:
    """(channel, url) of the 10,000 numbered channels then the 4 hot ones: fixed per seed."""
    rng = np.random.default_rng([seed, 0x6E65786D])
    n = CHANNELS_NUMBER + len(HOT_CHANNELS)
    parts = [_strings(rng, n, 5, "_") for _ in range(3)]
    url = pc.binary_join_element_wise("https://www.nexmark.com", *parts, "item.htm?query=1", "/")
    numbers = np.arange(CHANNELS_NUMBER)
    tagged = np.concatenate([rng.integers(0, 10, CHANNELS_NUMBER) > 0,
                             np.zeros(len(HOT_CHANNELS), dtype=bool)])
    channel_id = pc.cast(pa.array(np.concatenate([_reverse_bits32(numbers),
                                                  np.zeros(len(HOT_CHANNELS), np.int64)])),
                         pa.string())
    url = pc.if_else(pa.array(tagged), pc.binary_join_element_wise(url, "&channel_id=",
                                                                   channel_id, ""), url)
    names = pc.binary_join_element_wise("channel-", pc.cast(pa.array(numbers), pa.string()), "")
    names = pa.concat_arrays([names, pa.array(HOT_CHANNELS)])
    return names, url


# ------------------------------------------------------------------------------- the events

def _persons(cfg: GeneratorConfig, rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)
    name = pc.binary_join_element_wise(_pick(rng, FIRST_NAMES, n), _pick(rng, LAST_NAMES, n),
                                       " ")
    email = pc.binary_join_element_wise(_strings(rng, n, 7), "@", _strings(rng, n, 5), ".com",
                                        "")
    card = _credit_cards(rng, n)
    city = _pick(rng, US_CITIES, n)
    state = _pick(rng, US_STATES, n)
    size = 8 + sum(_lengths(a) for a in (name, email, card, city, state))
    return pa.Table.from_arrays(
        [pa.array(last_person_id(ids) + FIRST_PERSON_ID), name, email, card, city, state,
         pa.array(event_times_ms(cfg, ids)).cast(_TS), _extra(rng, size, cfg.avg_person_bytes)],
        schema=ARROW_SCHEMAS["person"])


def _auctions(cfg: GeneratorConfig, rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)
    hot = _hot(rng, n, cfg.hot_sellers_ratio)
    seller = np.where(hot, (last_person_id(ids) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
                      _random_person(rng, ids, cfg)) + FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, n)
    initial = _prices(rng, n)
    times = event_times_ms(cfg, ids)
    ahead = cfg.num_in_flight_auctions * PROPORTION_DENOMINATOR // AUCTION_PROPORTION
    horizon = event_times_ms(cfg, ids + ahead) - times
    expires = times + 1 + rng.integers(0, np.maximum(2 * horizon, 1))
    item = _strings(rng, n, 20)
    description = _strings(rng, n, 100)
    reserve = initial + _prices(rng, n)
    size = 8 + _lengths(item) + _lengths(description) + 40
    return pa.Table.from_arrays(
        [pa.array(last_auction_id(ids) + FIRST_AUCTION_ID), item, description, pa.array(initial),
         pa.array(reserve), pa.array(times).cast(_TS), pa.array(expires).cast(_TS),
         pa.array(seller), pa.array(category), _extra(rng, size, cfg.avg_auction_bytes)],
        schema=ARROW_SCHEMAS["auction"])


def _bids(cfg: GeneratorConfig, rng: np.random.Generator, ids: np.ndarray,
          channels: tuple[pa.Array, pa.Array]) -> pa.Table:
    n = len(ids)
    hot = _hot(rng, n, cfg.hot_auction_ratio)
    auction = np.where(hot, (last_auction_id(ids) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                       _random_auction(rng, ids, cfg)) + FIRST_AUCTION_ID
    hot = _hot(rng, n, cfg.hot_bidders_ratio)
    bidder = np.where(hot, (last_person_id(ids) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                      _random_person(rng, ids, cfg)) + FIRST_PERSON_ID
    price = _prices(rng, n)
    hot = _hot(rng, n, HOT_CHANNELS_RATIO)
    which = np.where(hot, CHANNELS_NUMBER + rng.integers(0, len(HOT_CHANNELS), n),
                     rng.integers(0, CHANNELS_NUMBER, n))
    pick = pa.array(which)
    return pa.Table.from_arrays(
        [pa.array(auction), pa.array(bidder), pa.array(price), channels[0].take(pick),
         channels[1].take(pick), pa.array(event_times_ms(cfg, ids)).cast(_TS),
         _extra(rng, np.full(n, 32), cfg.avg_bid_bytes)],
        schema=ARROW_SCHEMAS["bid"])


@dataclass
class EventBatch:
    """Events ``[start, start + count)``: one Arrow table per kind and the event id of each row
    (rows are in id order within a kind)."""

    start: int
    count: int
    tables: dict[str, pa.Table]
    ids: dict[str, np.ndarray] = field(repr=False)

    def slice(self, start: int, stop: int) -> EventBatch:
        tables, ids = {}, {}
        for kind in KINDS:
            lo, hi = np.searchsorted(self.ids[kind], [start, stop])
            tables[kind] = self.tables[kind].slice(lo, hi - lo)
            ids[kind] = self.ids[kind][lo:hi]
        return EventBatch(start, stop - start, tables, ids)

    @staticmethod
    def concat(parts: list[EventBatch]) -> EventBatch:
        return EventBatch(parts[0].start, sum(p.count for p in parts),
                          {k: pa.concat_tables([p.tables[k] for p in parts]) for k in KINDS},
                          {k: np.concatenate([p.ids[k] for p in parts]) for k in KINDS})


class Generator:
    """Events of one configuration by id range; the same ids always give the same events."""

    def __init__(self, config: GeneratorConfig | None = None):
        self.config = config or GeneratorConfig()
        self._channels = _channel_table(self.config.seed)
        self._cached: tuple[int, EventBatch] | None = None

    def _block(self, b: int) -> EventBatch:
        if self._cached is not None and self._cached[0] == b:
            return self._cached[1]
        cfg = self.config
        ids = np.arange(b * BLOCK_EVENTS, (b + 1) * BLOCK_EVENTS, dtype=np.int64)
        kinds = event_kinds(ids)
        per_kind = {k: ids[kinds == i] for i, k in enumerate(KINDS)}
        rngs = [np.random.default_rng([cfg.seed, b, i]) for i in range(len(KINDS))]
        tables = {"person": _persons(cfg, rngs[0], per_kind["person"]),
                  "auction": _auctions(cfg, rngs[1], per_kind["auction"]),
                  "bid": _bids(cfg, rngs[2], per_kind["bid"], self._channels)}
        out = EventBatch(int(ids[0]), BLOCK_EVENTS, tables, per_kind)
        self._cached = (b, out)
        return out

    def events(self, start: int, count: int) -> EventBatch:
        """Events ``[start, start + count)``."""
        if start < 0 or count < 0:
            raise InvalidInput(f"nexmark events: start and count must be >= 0, got {start}, "
                               f"{count}")
        stop = start + count
        parts = [self._block(b).slice(max(start, b * BLOCK_EVENTS),
                                      min(stop, (b + 1) * BLOCK_EVENTS))
                 for b in range(start // BLOCK_EVENTS, -(-stop // BLOCK_EVENTS))]
        if not parts:
            empty = {k: ARROW_SCHEMAS[k].empty_table() for k in KINDS}
            return EventBatch(start, 0, empty, {k: np.zeros(0, np.int64) for k in KINDS})
        out = EventBatch.concat(parts)
        out.start = start
        return out

    def batches(self, count: int, batch_events: int, start: int = 0) -> Iterator[EventBatch]:
        """Events ``[start, start + count)`` in batches of ``batch_events`` (the last shorter)."""
        if batch_events < 1:
            raise InvalidInput(f"nexmark batch_events: must be >= 1, got {batch_events}")
        for lo in range(start, start + count, batch_events):
            yield self.events(lo, min(batch_events, start + count - lo))


# ------------------------------------------------------------------------------------- JSON

def _json_string(arr: pa.Array) -> pa.Array:
    """A JSON string literal per value (escapes backslash, quote and control characters)."""
    arr = pc.replace_substring(arr, "\\", "\\\\")
    arr = pc.replace_substring(arr, '"', '\\"')
    if pc.any(pc.match_substring_regex(arr, "[\\x00-\\x1f]")).as_py():
        for code in range(0x20):
            arr = pc.replace_substring(arr, chr(code), f"\\u{code:04x}")
    return pc.binary_join_element_wise('"', arr, '"', "")


def iso_ms(ms: np.ndarray) -> pa.Array:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ`` of each millisecond time, digits computed with numpy (Arrow's
    strftime costs ~6 us a value; this ~0.1 us). Years 0..9999 only."""
    ms = np.asarray(ms, dtype=np.int64)
    days, in_day = np.divmod(ms, 86_400_000)
    # days -> (year, month, day): H. Hinnant's civil_from_days, vectorised
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    if len(ms) and (year.min() < 0 or year.max() > 9999):
        raise InvalidInput("nexmark timestamps must fall in the years 0..9999")
    hour, rest = np.divmod(in_day, 3_600_000)
    minute, rest = np.divmod(rest, 60_000)
    second, milli = np.divmod(rest, 1000)
    out = np.frombuffer(b"0000-00-00T00:00:00.000Z", dtype=np.uint8)
    out = np.tile(out, (len(ms), 1))
    for value, at, width in ((year, 0, 4), (month, 5, 2), (day, 8, 2), (hour, 11, 2),
                             (minute, 14, 2), (second, 17, 2), (milli, 20, 3)):
        for i in range(width):
            out[:, at + width - 1 - i] += ((value // 10 ** i) % 10).astype(np.uint8)
    return _from_bytes(np.full(len(ms), 24), out.reshape(-1))


def _json_value(col: pa.ChunkedArray) -> pa.Array:
    col = col.combine_chunks()
    if pa.types.is_timestamp(col.type):
        ms = pc.cast(col.cast(pa.timestamp("ms", tz=col.type.tz)), pa.int64())
        return pc.binary_join_element_wise('"', iso_ms(ms.to_numpy()), '"', "")
    if pa.types.is_string(col.type):
        return _json_string(col)
    return pc.cast(col, pa.string())


def table_json(kind: str, table: pa.Table) -> pa.Array:
    """``{"table": kind, "w": 1, <columns>}`` per row, built with Arrow string kernels."""
    pieces: list = []
    lead = f'{{"table":"{kind}","w":1'
    for name in table.column_names:
        pieces += [f'{lead},"{name}":', _json_value(table[name])]
        lead = ""
    return pc.binary_join_element_wise(*pieces, "}", "")


def json_entries(batch: EventBatch) -> list[bytes]:
    """The batch's events as queue entries, in event-id order."""
    if batch.count == 0:
        return []
    arrays = [table_json(k, batch.tables[k]) for k in KINDS if batch.tables[k].num_rows]
    ids = np.concatenate([batch.ids[k] for k in KINDS if batch.tables[k].num_rows])
    merged = pa.concat_arrays(arrays).take(pa.array(np.argsort(ids, kind="stable")))
    return merged.cast(pa.binary()).to_pylist()


def columnar_entries(batch: EventBatch) -> list[bytes]:
    """The batch's events as columnar queue entries (pipeline/columnar.py): per kind, its rows
    in event-id order as Arrow record batches — read with no parse. Kinds are not interleaved:
    a micro-batch is a set of changes, so the order across tables does not change a result."""
    from headrace.pipeline.encoding import columnar

    return [e for k in KINDS if batch.tables[k].num_rows
            for e in columnar.encode(k, batch.tables[k], SCHEMAS[k])]
