"""Nexmark q0–q9 and q14–q22 in headrace's fluent pipeline API, each also as Spark batch SQL.

Each query is ``qN(src) -> Frame`` over ``src = {"person": Frame, "auction": Frame, "bid":
Frame}`` (``Pipeline.read_queue(queue, SCHEMAS)``); ``SQL[name]`` is the same query as batch
SQL over temp views ``person``, ``auction`` and ``bid``. The queries follow the Nexmark SQL of
the Flink/Feldera suites, with these spellings:

* a window is two columns ``window_start``/``window_end`` (``Frame.with_window``; in SQL
  ``window(dateTime, ...)`` flattened the same way), and a windowed join is an equi-join on
  them; q7's ``B.dateTime BETWEEN w.end - 10 s AND w.end`` becomes "the bid's own tumbling
  window" (so a bid exactly on a window's end belongs to the next window, not to both);
* joins rename columns first so that both sides never share a non-key name (``on=`` then
  keeps one copy of each key);
* the windowed queries (q5, q7, q8) declare ``dateTime`` as event time with a
  ``WATERMARK_DELAY`` watermark and group by ``F.window(...)``; the window stays event time
  downstream, so every stateful operator of theirs drops closed windows from state: the
  windowed aggregates, q5's max over the counts per window, and the joins on the window (q5,
  q7, q8); the stream is in event-time order, so no row is late and the result equals the
  batch result (q8's "GROUP BY id, name, window" is such an aggregate);
* q4's ``B.dateTime BETWEEN A.dateTime AND A.expires`` bounds each pair by the auction's own
  ``expires``, not by fixed durations, so it is a join plus a filter, not an interval join
  (``Frame.join(..., within=...)`` takes fixed bounds); q4 declares no event time;
* q5 returns ``auction, num, window_start, window_end`` (Flink's returns ``auction, num``: the
  window says which hop a count belongs to); q4 is Flink's form (max bid of each auction
  within its lifetime, averaged per category, no reserve check);
* q6 ("average selling price by seller") is Flink's ``AVG(final) OVER (PARTITION BY seller
  ORDER BY ... ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)`` over q4's closing prices, ordered
  by ``expires, id`` (Flink's text orders by a ``B.dateTime`` it selects ungrouped, invalid
  in Spark; the id makes the order total, so the batch oracle is deterministic), one row per
  closed auction: ``seller, auction, expires, avg_final``;
* q9, q18, q19 are ``ROW_NUMBER() OVER (...)`` then a filter on it (top-N); their ORDER BY
  gets the remaining bid columns as tie-breakers (q9: ``price DESC, dateTime``, then
  ``bidder, channel, url, extra``; q18: ``dateTime DESC, price DESC, channel, url, extra``;
  q19: ``price DESC, dateTime, bidder, channel, url, extra``), because Spark numbers tied rows
  in no defined order; with them only identical bids tie, which number alike.

Of q9–q22, q9, q11 (session windows), q14–q22 are here too; ``NOT_EXPRESSIBLE`` says why each
of the others is not (processing time, side effects, static side inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headrace.pipeline.api.frame import Frame

WINDOW = "10 seconds"  # q5, q7, q8 (Nexmark's windowSizeSec)
HOP = "2 seconds"  # q5's slide (Flink/Feldera's q5)
WATERMARK_DELAY = "10 seconds"
AUCTION_SKIP = 123  # q2: every 123rd auction
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
EURO_RATE = 0.908  # q1: dollars to euros
Q6_PRECEDING = 10  # q6: ROWS BETWEEN 10 PRECEDING AND CURRENT ROW
Q19_TOP = 10
Q11_GAP = "10 seconds"  # q11: a bidder's session ends after 10 s without a bid
# ROW_NUMBER's ties broken by every other bid column, so Spark's batch result is deterministic
# (two bids equal in all of them are the same row)
BID_TIES = ("bidder", "channel", "url", "extra")


def _F():
    from pyspark.sql import functions as F

    return F


def q0(src: dict[str, Frame]) -> Frame:
    """Pass-through: every bid."""
    return src["bid"].select("auction", "bidder", "price", "dateTime", "extra")


def q1(src: dict[str, Frame]) -> Frame:
    """Currency conversion: bid prices in euros."""
    F = _F()
    return src["bid"].select("auction", "bidder", (F.col("price") * EURO_RATE).alias("price"),
                             "dateTime", "extra")


def q2(src: dict[str, Frame]) -> Frame:
    """Selection: bids on every 123rd auction."""
    F = _F()
    return src["bid"].filter(F.col("auction") % AUCTION_SKIP == 0).select("auction", "price")


def q3(src: dict[str, Frame]) -> Frame:
    """Local item suggestion: sellers in OR/ID/CA of auctions in category 10 (a join)."""
    F = _F()
    auctions = (src["auction"].filter(F.col("category") == Q3_CATEGORY)
                .select(F.col("id").alias("auction_id"), F.col("seller").alias("person_id")))
    persons = (src["person"].filter(F.col("state").isin(*Q3_STATES))
               .select(F.col("id").alias("person_id"), "name", "city", "state"))
    return auctions.join(persons, on=["person_id"]).select("name", "city", "state", "auction_id")


def _closing_prices(src: dict[str, Frame], *columns: str) -> Frame:
    """Each auction's top bid within its lifetime: ``auction``, the auction's ``columns``,
    ``final`` (q4, q6)."""
    F = _F()
    auctions = src["auction"].select(F.col("id").alias("auction"),
                                     *[c for c in columns if c != "expires"],
                                     F.col("dateTime").alias("opened"), "expires")
    bids = src["bid"].select("auction", "price", F.col("dateTime").alias("bid_time"))
    in_time = (auctions.join(bids, on=["auction"])
               .filter(F.col("bid_time").between(F.col("opened"), F.col("expires"))))
    return in_time.group_by("auction", *columns).agg(F.max("price").alias("final"))


def q4(src: dict[str, Frame]) -> Frame:
    """Average closing price per category: each auction's top bid within its lifetime."""
    F = _F()
    final = _closing_prices(src, "category")
    return final.group_by("category").agg(F.avg("final").alias("avg_final"))


def _window():
    from pyspark.sql import Window

    return Window


def q6(src: dict[str, Frame]) -> Frame:
    """Average selling price by seller: at each closed auction of a seller, the average
    closing price over that auction and the seller's 10 before it (by expiry, then id)."""
    F = _F()
    final = _closing_prices(src, "seller", "expires")
    last = (_window().partitionBy("seller").orderBy("expires", "auction")
            .rowsBetween(-Q6_PRECEDING, 0))
    return (final.with_column("avg_final", F.avg("final").over(last))
            .select("seller", "auction", "expires", "avg_final"))


def _event_time(frame: Frame) -> Frame:
    return frame.with_watermark("dateTime", WATERMARK_DELAY)


def q5(src: dict[str, Frame]) -> Frame:
    """Hot items: the auctions with the most bids in each 10 s window hopping by 2 s."""
    F = _F()
    counts = (_event_time(src["bid"]).group_by(F.window("dateTime", WINDOW, HOP), "auction")
              .agg(F.count("*").alias("num")))
    top = counts.group_by("window_start", "window_end").agg(F.max("num").alias("maxn"))
    return (counts.join(top, on=["window_start", "window_end"])
            .filter(F.col("num") >= F.col("maxn"))
            .select("auction", "num", "window_start", "window_end"))


def q7(src: dict[str, Frame]) -> Frame:
    """Highest bid: the bids at the top price of each 10 s tumbling window."""
    F = _F()
    bids = _event_time(src["bid"])
    top = bids.group_by(F.window("dateTime", WINDOW)).agg(F.max("price").alias("price"))
    return (bids.with_window("dateTime", WINDOW)
            .join(top, on=["window_start", "window_end", "price"])
            .select("auction", "price", "bidder", "dateTime", "extra"))


def q11(src: dict[str, Frame]) -> Frame:
    """User sessions: per bidder, the bids of each session (it ends after 10 s without one)."""
    F = _F()
    return (_event_time(src["bid"]).group_by("bidder", F.session_window("dateTime", Q11_GAP))
            .agg(F.count("*").alias("bid_count"))
            .select("bidder", "bid_count", F.col("session_window_start").alias("starttime"),
                    F.col("session_window_end").alias("endtime")))


def q8(src: dict[str, Frame]) -> Frame:
    """Monitor new users: people who opened an auction in the 10 s window they registered in."""
    F = _F()
    persons = (_event_time(src["person"]).group_by(F.window("dateTime", WINDOW), "id", "name")
               .agg(F.count("*").alias("n")).select("id", "name", "window_start", "window_end"))
    sellers = (_event_time(src["auction"]).group_by(F.window("dateTime", WINDOW), "seller")
               .agg(F.count("*").alias("n"))
               .select(F.col("seller").alias("id"), "window_start", "window_end"))
    return (persons.join(sellers, on=["id", "window_start", "window_end"])
            .select("id", "name", F.col("window_start").alias("starttime")))


def _win(table: str, columns: str, size: str = WINDOW, slide: str | None = None) -> str:
    """A subquery over ``table`` with its window flattened into window_start/window_end."""
    w = f"window(dateTime, '{size}', '{slide}')" if slide else f"window(dateTime, '{size}')"
    return (f"(SELECT {columns}, w.start AS window_start, w.end AS window_end "
            f"FROM (SELECT *, {w} AS w FROM {table}))")


SQL: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": f"SELECT auction, bidder, price * {EURO_RATE}D AS price, dateTime, extra FROM bid",
    "q2": f"SELECT auction, price FROM bid WHERE auction % {AUCTION_SKIP} = 0",
    "q3": ("SELECT P.name, P.city, P.state, A.id AS auction_id "
           "FROM auction A JOIN person P ON A.seller = P.id "
           f"WHERE A.category = {Q3_CATEGORY} AND P.state IN {Q3_STATES!r}"),
    "q4": ("SELECT category, AVG(final) AS avg_final FROM ("
           "  SELECT A.id, A.category, MAX(B.price) AS final"
           "  FROM auction A JOIN bid B ON A.id = B.auction"
           "  WHERE B.dateTime BETWEEN A.dateTime AND A.expires"
           "  GROUP BY A.id, A.category) GROUP BY category"),
    "q6": ("SELECT seller, id AS auction, expires, AVG(final) OVER (PARTITION BY seller "
           f"ORDER BY expires, id ROWS BETWEEN {Q6_PRECEDING} PRECEDING AND CURRENT ROW) "
           "AS avg_final FROM ("
           "  SELECT A.id, A.seller, A.expires, MAX(B.price) AS final"
           "  FROM auction A JOIN bid B ON A.id = B.auction"
           "  WHERE B.dateTime BETWEEN A.dateTime AND A.expires"
           "  GROUP BY A.id, A.seller, A.expires)"),
    "q5": (f"WITH C AS (SELECT auction, window_start, window_end, count(*) AS num "
           f"  FROM {_win('bid', 'auction', WINDOW, HOP)} "
           "  GROUP BY auction, window_start, window_end), "
           "M AS (SELECT window_start, window_end, max(num) AS maxn FROM C "
           "  GROUP BY window_start, window_end) "
           "SELECT C.auction, C.num, C.window_start, C.window_end FROM C JOIN M "
           "ON C.window_start = M.window_start AND C.window_end = M.window_end "
           "WHERE C.num >= M.maxn"),
    "q7": (f"WITH B AS {_win('bid', 'auction, price, bidder, dateTime, extra')}, "
           "M AS (SELECT window_start, window_end, max(price) AS price FROM B "
           "  GROUP BY window_start, window_end) "
           "SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM B JOIN M "
           "ON B.window_start = M.window_start AND B.window_end = M.window_end "
           "AND B.price = M.price"),
    "q8": (f"WITH P AS (SELECT DISTINCT id, name, window_start, window_end "
           f"  FROM {_win('person', 'id, name')}), "
           f"A AS (SELECT DISTINCT seller, window_start, window_end "
           f"  FROM {_win('auction', 'seller')}) "
           "SELECT P.id, P.name, P.window_start AS starttime FROM P JOIN A "
           "ON P.id = A.seller AND P.window_start = A.window_start "
           "AND P.window_end = A.window_end"),
}

def _euro():
    return _F().col("price") * EURO_RATE


def q14(src: dict[str, Frame]) -> Frame:
    """Calculation: expensive bids in euros, the time of day they came in, and how many 'c's
    their extra holds (Flink's ``count_char`` UDF as a length difference)."""
    F = _F()
    hour = F.hour("dateTime")
    kind = (F.when((hour >= 8) & (hour <= 18), "dayTime")
            .when((hour <= 6) | (hour >= 20), "nightTime").otherwise("otherTime"))
    c_counts = F.length("extra") - F.length(F.regexp_replace("extra", "c", ""))
    return (src["bid"].filter((_euro() > 1_000_000) & (_euro() < 50_000_000))
            .select("auction", "bidder", _euro().alias("price"), kind.alias("bidTimeType"),
                    "dateTime", "extra", c_counts.alias("c_counts")))


_RANKS = (("rank1", "price < 10000"), ("rank2", "price >= 10000 AND price < 1000000"),
          ("rank3", "price >= 1000000"))


def _rank_aggs(distinct: bool):
    """count(*) and count(DISTINCT bidder/auction), each also per price rank: Flink's
    ``FILTER (WHERE ...)`` as a count of a CASE that is NULL outside the rank."""
    F = _F()
    out = [F.count("*").alias("total_bids")]
    out += [F.count(F.when(F.expr(cond), 1)).alias(f"{r}_bids") for r, cond in _RANKS]
    if distinct:
        for col, label in (("bidder", "bidders"), ("auction", "auctions")):
            out.append(F.count_distinct(col).alias(f"total_{label}"))
            out += [F.count_distinct(F.when(F.expr(cond), F.col(col))).alias(f"{r}_{label}")
                    for r, cond in _RANKS]
    return out


def _day():
    return _F().date_format("dateTime", "yyyy-MM-dd").alias("day")


def q15(src: dict[str, Frame]) -> Frame:
    """Bidding statistics per day: bids, bidders and auctions, overall and per price rank."""
    return src["bid"].group_by(_day()).agg(*_rank_aggs(distinct=True))


def q16(src: dict[str, Frame]) -> Frame:
    """q15 per channel and day."""
    return src["bid"].group_by("channel", _day()).agg(*_rank_aggs(distinct=True))


def q17(src: dict[str, Frame]) -> Frame:
    """Auction statistics per day: bids per price rank, min/max/avg/sum of the price."""
    F = _F()
    return src["bid"].group_by("auction", _day()).agg(
        *_rank_aggs(distinct=False), F.min("price").alias("min_price"),
        F.max("price").alias("max_price"), F.avg("price").alias("avg_price"),
        F.sum("price").alias("sum_price"))


Q9_AUCTION = ("id", "itemName", "description", "initialBid", "reserve", "dateTime", "expires",
              "seller", "category", "extra")
Q9_COLUMNS = (*Q9_AUCTION, "auction", "bidder", "price", "bid_dateTime", "bid_extra")


def q9(src: dict[str, Frame]) -> Frame:
    """Winning bids: each auction with its highest bid within its lifetime (the earliest on a
    tie, then the bid columns as tie-breakers)."""
    F = _F()
    bids = src["bid"].select("auction", "bidder", "price", "channel", "url",
                             F.col("dateTime").alias("bid_dateTime"),
                             F.col("extra").alias("bid_extra"))
    pairs = (src["auction"].select(*Q9_AUCTION).join(bids, left_on="id", right_on="auction")
             .filter(F.col("bid_dateTime").between(F.col("dateTime"), F.col("expires"))))
    first = _window().partitionBy("id").orderBy(
        F.desc("price"), "bid_dateTime", "bidder", "channel", "url", "bid_extra")
    return (pairs.with_column("rownum", F.row_number().over(first))
            .filter(F.col("rownum") <= 1).select(*Q9_COLUMNS))


Q18_COLUMNS = ("auction", "bidder", "price", "channel", "url", "dateTime", "extra")


def q18(src: dict[str, Frame]) -> Frame:
    """The last bid of each bidder on each auction (ties: the higher price, then the other
    columns)."""
    F = _F()
    last = _window().partitionBy("bidder", "auction").orderBy(
        F.desc("dateTime"), F.desc("price"), "channel", "url", "extra")
    return (src["bid"].with_column("rank_number", F.row_number().over(last))
            .filter(F.col("rank_number") <= 1).select(*Q18_COLUMNS))


def q19(src: dict[str, Frame]) -> Frame:
    """The 10 highest bids of each auction, numbered (ties: the earlier, then the other
    columns)."""
    F = _F()
    top = _window().partitionBy("auction").orderBy(F.desc("price"), "dateTime", *BID_TIES)
    return (src["bid"].with_column("rank_number", F.row_number().over(top))
            .filter(F.col("rank_number") <= Q19_TOP))


def q20(src: dict[str, Frame]) -> Frame:
    """Expand bid with auction: every bid joined with its auction's fields, category 10."""
    F = _F()
    auctions = (src["auction"].filter(F.col("category") == Q3_CATEGORY)
                .select(F.col("id").alias("auction"), "itemName", "description", "initialBid",
                        "reserve", F.col("dateTime").alias("auction_dateTime"), "expires",
                        "seller", "category", F.col("extra").alias("auction_extra")))
    return src["bid"].join(auctions, on=["auction"]).select(*Q20_COLUMNS)


Q20_COLUMNS = ("auction", "bidder", "price", "channel", "url", "dateTime", "extra", "itemName",
               "description", "initialBid", "reserve", "auction_dateTime", "expires", "seller",
               "category", "auction_extra")
_CHANNEL_ID = "nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '')"
_HOT_IDS = (("apple", "0"), ("google", "1"), ("facebook", "2"), ("baidu", "3"))
_Q21_ID = ("CASE " + " ".join(f"WHEN lower(channel) = '{c}' THEN '{i}'" for c, i in _HOT_IDS)
           + f" ELSE {_CHANNEL_ID} END")
_Q21_WHERE = (f"{_CHANNEL_ID} IS NOT NULL OR lower(channel) IN "
              f"({', '.join(repr(c) for c, _ in _HOT_IDS)})")


def q21(src: dict[str, Frame]) -> Frame:
    """Add a channel id: the hot channels' fixed ids, else the one in the URL."""
    F = _F()
    return (src["bid"].filter(F.expr(_Q21_WHERE))
            .select("auction", "bidder", "price", "channel",
                    F.expr(_Q21_ID).alias("channel_id")))


def q22(src: dict[str, Frame]) -> Frame:
    """Get URL directories: the 3 path segments of each bid's URL."""
    F = _F()
    parts = F.split("url", "/")
    return src["bid"].select("auction", "bidder", "price", "channel",
                             *[F.get(parts, i).alias(f"dir{i - 2}") for i in (3, 4, 5)])


_RANK_SQL_BIDS = ", ".join(f"count(*) FILTER (WHERE {c}) AS {r}_bids" for r, c in _RANKS)
_RANK_SQL_DISTINCT = ", ".join(
    f"count(DISTINCT {col}) AS total_{label}, "
    + ", ".join(f"count(DISTINCT {col}) FILTER (WHERE {c}) AS {r}_{label}" for r, c in _RANKS)
    for col, label in (("bidder", "bidders"), ("auction", "auctions")))
_DAY_SQL = "date_format(dateTime, 'yyyy-MM-dd')"

SQL.update({
    "q14": (f"SELECT auction, bidder, {EURO_RATE}D * price AS price, CASE "
            "WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime' "
            "WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
            "ELSE 'otherTime' END AS bidTimeType, dateTime, extra, "
            "length(extra) - length(replace(extra, 'c', '')) AS c_counts FROM bid "
            f"WHERE {EURO_RATE}D * price > 1000000 AND {EURO_RATE}D * price < 50000000"),
    "q15": (f"SELECT {_DAY_SQL} AS day, count(*) AS total_bids, {_RANK_SQL_BIDS}, "
            f"{_RANK_SQL_DISTINCT} FROM bid GROUP BY {_DAY_SQL}"),
    "q16": (f"SELECT channel, {_DAY_SQL} AS day, count(*) AS total_bids, {_RANK_SQL_BIDS}, "
            f"{_RANK_SQL_DISTINCT} FROM bid GROUP BY channel, {_DAY_SQL}"),
    "q17": (f"SELECT auction, {_DAY_SQL} AS day, count(*) AS total_bids, {_RANK_SQL_BIDS}, "
            "min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, "
            f"sum(price) AS sum_price FROM bid GROUP BY auction, {_DAY_SQL}"),
    "q9": (f"SELECT {', '.join(Q9_COLUMNS)} FROM (SELECT A.*, B.auction, B.bidder, B.price, "
           "B.dateTime AS bid_dateTime, B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY "
           "A.id ORDER BY B.price DESC, B.dateTime, B.bidder, B.channel, B.url, B.extra) AS "
           "rownum FROM auction A JOIN bid B ON A.id = B.auction "
           "WHERE B.dateTime BETWEEN A.dateTime AND A.expires) WHERE rownum <= 1"),
    "q18": (f"SELECT {', '.join(Q18_COLUMNS)} FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "
            "bidder, auction ORDER BY dateTime DESC, price DESC, channel, url, extra) AS "
            "rank_number FROM bid) WHERE rank_number <= 1"),
    "q19": ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY "
            f"price DESC, dateTime, {', '.join(BID_TIES)}) AS rank_number FROM bid) "
            f"WHERE rank_number <= {Q19_TOP}"),
    "q20": ("SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.dateTime, B.extra, "
            "A.itemName, A.description, A.initialBid, A.reserve, A.dateTime AS auction_dateTime, "
            "A.expires, A.seller, A.category, A.extra AS auction_extra "
            f"FROM bid B JOIN auction A ON B.auction = A.id WHERE A.category = {Q3_CATEGORY}"),
    "q21": (f"SELECT auction, bidder, price, channel, {_Q21_ID} AS channel_id FROM bid "
            f"WHERE {_Q21_WHERE}"),
    "q11": ("SELECT bidder, count(*) AS bid_count, session_window.start AS starttime, "
            "session_window.end AS endtime FROM bid "
            f"GROUP BY bidder, session_window(dateTime, '{Q11_GAP}')"),
    "q22": ("SELECT auction, bidder, price, channel, get(split(url, '/'), 3) AS dir1, "
            "get(split(url, '/'), 4) AS dir2, get(split(url, '/'), 5) AS dir3 FROM bid"),
})

NOT_EXPRESSIBLE = {
    "q10": "writes events to files partitioned by time: a sink, not a query result",
    "q12": "processing-time windows: results depend on the wall clock, not on the events",
    "q13": "joins a static side input read from a file: not a queue table",
}


@dataclass(frozen=True)
class Query:
    name: str
    build: Callable[[dict], Frame]
    sql: str
    tables: tuple[str, ...]  # the tables it reads
    windowed: bool  # holds only open windows in state (bounded state on an endless stream)


QUERIES: dict[str, Query] = {
    "q0": Query("q0", q0, SQL["q0"], ("bid",), False),
    "q1": Query("q1", q1, SQL["q1"], ("bid",), False),
    "q2": Query("q2", q2, SQL["q2"], ("bid",), False),
    "q3": Query("q3", q3, SQL["q3"], ("auction", "person"), False),
    "q4": Query("q4", q4, SQL["q4"], ("auction", "bid"), False),
    "q5": Query("q5", q5, SQL["q5"], ("bid",), True),
    "q6": Query("q6", q6, SQL["q6"], ("auction", "bid"), False),
    "q7": Query("q7", q7, SQL["q7"], ("bid",), True),
    "q8": Query("q8", q8, SQL["q8"], ("person", "auction"), True),
    # beyond q0–q8: the ones of q9–q22 the API can say
    "q9": Query("q9", q9, SQL["q9"], ("auction", "bid"), False),
    "q11": Query("q11", q11, SQL["q11"], ("bid",), True),
    "q14": Query("q14", q14, SQL["q14"], ("bid",), False),
    "q15": Query("q15", q15, SQL["q15"], ("bid",), False),
    "q16": Query("q16", q16, SQL["q16"], ("bid",), False),
    "q17": Query("q17", q17, SQL["q17"], ("bid",), False),
    "q18": Query("q18", q18, SQL["q18"], ("bid",), False),
    "q19": Query("q19", q19, SQL["q19"], ("bid",), False),
    "q20": Query("q20", q20, SQL["q20"], ("bid", "auction"), False),
    "q21": Query("q21", q21, SQL["q21"], ("bid",), False),
    "q22": Query("q22", q22, SQL["q22"], ("bid",), False),
}
CORE = tuple(f"q{i}" for i in range(9))  # the core queries: the benchmark's default set
