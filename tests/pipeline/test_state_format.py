"""The state's byte formats: root page, run index page and run pages refuse every bad byte
with a FormatError naming the page and offset, never another exception or a wrong answer."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest

from headrace.codec import crc32
from headrace.errors import ChecksumMismatch, FormatError
from headrace.pipeline.state import BucketLSM, LSMConfig, page_id
from headrace.pipeline.state.layout import Root, decode_index, encode_index
from headrace.pipeline.state.pages import (
    CODEC_NONE,
    CODEC_ZSTD,
    CODEC_ZSTD_PLANES,
    decode_page,
    encode_run,
)
from headrace.pipeline.state.rows import sorted_zset
from headrace.reservoir import PageRunWriter, ReservoirReader, ReservoirStorage
from headrace.store import LocalStore

PID = page_id(5, 1, 77, 0)


def kb(x: int) -> bytes:
    return int(x).to_bytes(8, "big")


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return sorted_zset(pa.table({
        "key": pa.array([kb(k) for k in rng.integers(0, 1000, n)], pa.binary()),
        "val": pa.array([b"v" * int(x) for x in rng.integers(0, 20, n)], pa.binary()),
        "w": pa.array(rng.integers(1, 3, n), pa.int64())}))


def _with_crc(body: bytes) -> bytes:
    return body + struct.pack("<I", crc32(body))


def _state(tmp_path, cfg: LSMConfig, batches: int = 3):
    store = LocalStore(str(tmp_path / "s"), fsync=False)
    storage = ReservoirStorage.open(store)
    reader = None
    for i in range(batches):
        lsm = BucketLSM(reader, 5, 1, 77, cfg)
        lsm.insert_updates(_table(300, i))
        w = PageRunWriter(store, run_id=f"t{i}")
        lsm.write(w)
        storage.absorb([w.finish()])
        reader = ReservoirReader.open(store, version=storage.checkpoint())
    return store, storage, reader


def _replace_page(store, storage, pid: int, data: bytes):
    w = PageRunWriter(store, run_id=f"bad-{pid}")
    w.write(pid, data)
    storage.absorb([w.finish()])
    return ReservoirReader.open(store, version=storage.checkpoint())


def test_root_round_trips_and_every_bit_flip_is_refused(tmp_path):
    cfg = LSMConfig(page_bytes=512, fanout=50, inline_fence_pages=3)
    store, storage, reader = _state(tmp_path, cfg, batches=3)
    good = bytes(reader.read(PID))
    root = Root.from_bytes(good, pid=PID)
    assert Root(root.next_seq, root.runs).to_bytes() == good
    for pos in range(0, len(good), max(1, len(good) // 97)):
        bad = bytearray(good)
        bad[pos] ^= 0x10
        with pytest.raises(FormatError, match=f"{PID:#x}"):
            Root.from_bytes(bytes(bad), pid=PID)
    # a corrupt root in the store: opening the bucket fails, naming the page
    reader = _replace_page(store, storage, PID, good[:-5] + bytes([good[-5] ^ 1]) + good[-4:])
    with pytest.raises(ChecksumMismatch, match=f"state page {PID:#x}.*bucket 77"):
        BucketLSM(reader, 5, 1, 77, cfg)
    storage.close()


def _as_version(v3: bytes, version: int) -> bytes:
    """A version-3 root without deleted ranges or run slices as the release before wrote it
    (40-byte run records, a run's index page right after its pages)."""
    body = v3[:-4]
    (n_runs,) = struct.unpack_from("<I", body, 16)
    assert struct.unpack_from("<I", body, 28) == (0,)
    recs = []
    for i in range(n_runs):
        rec = body[32 + 56 * i: 32 + 56 * (i + 1)]
        first, pages, _k, inline = struct.unpack_from("<QIBB", rec)
        index_seq, index_from = struct.unpack_from("<QI", rec, 40)
        assert (index_seq, index_from) == ((0, 0) if inline else (first + pages, 0))
        recs.append(rec[:40])
    head = body[:4] + bytes([version]) + body[5:32]
    return _with_crc(head + b"".join(recs) + body[32 + 56 * n_runs:])


def test_a_version_1_root_reads_its_tombstones_as_before(tmp_path):
    """Roots of earlier releases read as written: version 1 (kind 1 = tombstone runs of
    markers) and version 2 (replacing runs) under version 3's rules: the deleted key stays
    deleted, the others stay."""
    cfg = LSMConfig(page_bytes=512, fanout=50)
    store, storage, reader = _state(tmp_path, cfg, batches=2)
    lsm = BucketLSM(reader, 5, 1, 77, cfg)
    lsm.delete_keys(pa.array([kb(k) for k in range(0, 1000, 2)], pa.binary()))
    w = PageRunWriter(store, run_id="del")
    lsm.write(w)
    storage.absorb([w.finish()])
    reader = ReservoirReader.open(store, version=storage.checkpoint())
    probe = pa.array([kb(k) for k in range(1000)], pa.binary())
    want = BucketLSM(reader, 5, 1, 77, cfg).lookup_many(probe)
    v3 = bytes(reader.read(PID))
    root = Root.from_bytes(v3, pid=PID)
    assert root.runs[-1].kind == 1 and v3[4] == 3 and not root.runs[0].inline
    for version in (2, 1):
        reader = _replace_page(store, storage, PID, _as_version(v3, version))
        assert BucketLSM(reader, 5, 1, 77, cfg).lookup_many(probe).equals(want)
    assert want.num_rows and all(int.from_bytes(k, "big") % 2 for k in
                                 want.column("key").to_pylist())
    storage.close()


def _root_fields(good: bytes):
    return bytearray(good[:-4])


@pytest.mark.parametrize("offset,value,what", [
    (0, b"XXXX", "magic"),
    (4, b"\x04", "version"),
    (8, struct.pack("<Q", 0), "next_seq"),
    (16, struct.pack("<I", 10**6), "runs"),
    (20, struct.pack("<I", 0), "inline pages"),
    (32, struct.pack("<Q", 0), "first_seq 0"),  # run 0's first_seq
    (32, struct.pack("<Q", 10**9), "next_seq"),  # run 0 past the counter
    (40, struct.pack("<I", 0), "at least one page"),
    (44, b"\x07", "kind"),
    (45, b"\x05", "inline flag"),
    (46, b"\x01", "reserved"),
])
def test_root_structure_is_checked_even_with_a_valid_crc(tmp_path, offset, value, what):
    cfg = LSMConfig(page_bytes=512, fanout=50, inline_fence_pages=100)
    _, storage, reader = _state(tmp_path, cfg, batches=2)
    body = _root_fields(bytes(reader.read(PID)))
    body[offset:offset + len(value)] = value
    with pytest.raises(FormatError, match=what) as e:
        Root.from_bytes(_with_crc(bytes(body)), pid=PID)
    assert e.value.key.startswith(f"state page {PID:#x}")
    assert e.value.offset is not None and e.value.offset >= offset - 16
    storage.close()


def test_overlapping_runs_and_unsorted_fences_are_refused(tmp_path):
    cfg = LSMConfig(page_bytes=512, fanout=50, inline_fence_pages=100)
    _, storage, reader = _state(tmp_path, cfg, batches=2)
    good = bytes(reader.read(PID))
    root = Root.from_bytes(good, pid=PID)
    root.runs[1].first_seq = root.runs[0].first_seq + 1
    with pytest.raises(FormatError, match="overlap"):
        Root.from_bytes(root.to_bytes(), pid=PID)
    root = Root.from_bytes(good, pid=PID)
    f = root.runs[0].fences
    f.firsts[0], f.lasts[0] = f.lasts[0], f.firsts[0]
    with pytest.raises(FormatError, match="fence key 0"):
        Root.from_bytes(root.to_bytes(), pid=PID)
    storage.close()


def test_random_root_mutations_with_valid_crc_raise_only_format_errors():
    enc = encode_run(_table(800), 256, CODEC_NONE, 1)
    from headrace.pipeline.state.layout import RunMeta
    root = Root(100, [RunMeta(1, enc.pages, 0, True, enc.rows, enc.raw_bytes, len(enc.blob),
                              enc.fences)])
    good = root.to_bytes()
    rng = np.random.default_rng(1)
    for _ in range(400):
        body = bytearray(good[:-4])
        for _ in range(int(rng.integers(1, 4))):
            body[int(rng.integers(0, len(body)))] = int(rng.integers(0, 256))
        cut = int(rng.integers(len(body) - 8, len(body) + 1))
        try:
            Root.from_bytes(_with_crc(bytes(body[:cut])), pid=PID)
        except FormatError:
            pass


def test_index_page_is_checked():
    enc = encode_run(_table(800), 256, CODEC_ZSTD, 1)
    good = encode_index(enc.fences)
    f = decode_index(good, pid=PID, pages=enc.pages)
    assert f.firsts.tolist() == enc.fences.firsts.tolist()
    with pytest.raises(FormatError, match="holds"):
        decode_index(good, pid=PID, pages=enc.pages + 1)
    with pytest.raises(ChecksumMismatch):
        decode_index(good[:10] + b"\xee" + good[11:], pid=PID, pages=enc.pages)
    with pytest.raises(FormatError, match="magic"):
        decode_index(_with_crc(b"HRLX" + good[4:-4]), pid=PID, pages=enc.pages)
    with pytest.raises(FormatError, match="shorter"):
        decode_index(b"\x00", pid=PID, pages=1)


def _fixed_table(n: int, seed: int = 0) -> pa.Table:
    """Rows like an aggregate's state: 10-byte keys, 45-byte vals of small numbers."""
    rng = np.random.default_rng(seed)
    keys = sorted({b"\x00\x01" + kb(k) for k in rng.integers(0, 10**6, n)})
    vals = [b"".join(b"\x01" + kb(x) for x in rng.integers(0, 50, 5)) for _ in keys]
    return sorted_zset(pa.table({"key": pa.array(keys, pa.binary()),
                                 "val": pa.array(vals, pa.binary()),
                                 "w": pa.array(np.ones(len(keys), np.int64))}))


@pytest.mark.parametrize("codec,table", [(CODEC_NONE, _table), (CODEC_ZSTD, _table),
                                         (CODEC_ZSTD_PLANES, _table),
                                         (CODEC_ZSTD_PLANES, _fixed_table)])
def test_run_pages_round_trip_and_refuse_bad_bytes(codec, table):
    t = table(2000)
    enc = encode_run(t, 1024, codec, 1)
    assert enc.pages > 3
    ends = np.cumsum(enc.sizes)
    pages = [enc.blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    back = pa.Table.from_batches([decode_page(p, pid=PID + i + 1, first=enc.fences.firsts[i],
                                              last=enc.fences.lasts[i])
                                  for i, p in enumerate(pages)])
    assert back.equals(t)
    p = pages[1]
    with pytest.raises(FormatError, match="do not match the fences"):
        decode_page(p, pid=PID, first=enc.fences.firsts[0], last=enc.fences.lasts[0])
    with pytest.raises(ChecksumMismatch, match=f"{PID:#x}"):
        decode_page(p[:20] + bytes([p[20] ^ 1]) + p[21:], pid=PID)
    rng = np.random.default_rng(2)
    for _ in range(300):  # structure checked even when the checksum is right
        body = bytearray(p[:-4])
        for _ in range(int(rng.integers(1, 4))):
            body[int(rng.integers(0, len(body)))] = int(rng.integers(0, 256))
        try:
            got = decode_page(_with_crc(bytes(body)), pid=PID)
        except FormatError as e:
            assert e.key.startswith(f"state page {PID:#x}")
            continue
        got.validate(full=True)  # whatever decodes is a well-formed Arrow batch


def test_page_offsets_out_of_order_name_the_offset():
    enc = encode_run(_table(50), 1 << 16, CODEC_NONE, 1)
    page = bytearray(enc.blob[:-4])
    rows = struct.unpack_from("<I", page, 8)[0]
    koff_at = 16 + 8 * rows
    struct.pack_into("<I", page, koff_at + 4 * 3, 10**6)  # key offset 3 jumps far ahead
    with pytest.raises(FormatError, match="key offset 4 is out of order") as e:
        decode_page(_with_crc(bytes(page)), pid=PID)
    assert e.value.offset == koff_at + 4 * 4
    page = bytearray(enc.blob[:-4])
    struct.pack_into("<I", page, 12, 1 << 30)
    with pytest.raises(FormatError, match="limit"):
        decode_page(_with_crc(bytes(page)), pid=PID)


def test_byte_planes_make_fixed_width_state_pages_much_smaller():
    """Codec 2 stores aggregate-like rows (fixed-width keys and vals of small numbers) in well
    under half the bytes of zstd over the row layout, and reads back the same rows."""
    t = _fixed_table(3000, seed=4)
    rows = encode_run(t, 32 * 1024, CODEC_ZSTD, 1)
    planes = encode_run(t, 32 * 1024, CODEC_ZSTD_PLANES, 1)
    assert len(planes.blob) * 2 < len(rows.blob)
    ends = np.cumsum(planes.sizes)
    back = pa.Table.from_batches([decode_page(planes.blob[a:b], pid=PID)
                                  for a, b in zip([0, *ends[:-1]], ends, strict=True)])
    assert back.equals(t)


# -- deleted ranges and run slices (root version 3) ---------------------------------------------

def _ranged_state(tmp_path):
    """Two runs of ~20 pages each, then keys [300, 600) deleted: each run loses the pages
    inside the range and becomes two slices sharing its index page; the straddling pages
    keep the range in the root."""
    cfg = LSMConfig(page_bytes=512, fanout=50, inline_fence_pages=2)
    store, storage, reader = _state(tmp_path, cfg, batches=2)
    lsm = BucketLSM(reader, 5, 1, 77, cfg)
    lsm.delete_range(kb(300), kb(600))
    w = PageRunWriter(store, run_id="range")
    stats = lsm.write(w)
    storage.absorb([w.finish()])
    reader = ReservoirReader.open(store, version=storage.checkpoint())
    root = Root.from_bytes(reader.read(PID), pid=PID)
    assert stats.pages_dropped > 4 and len(root.ranges) == 1 and len(root.runs) == 4
    assert root.runs[0].index_seq == root.runs[1].index_seq and root.runs[1].index_from > 0
    return storage, reader, root


def test_a_root_with_deleted_ranges_and_run_slices_round_trips(tmp_path):
    storage, reader, root = _ranged_state(tmp_path)
    good = bytes(reader.read(PID))
    assert root.to_bytes() == good
    for pos in range(0, len(good), max(1, len(good) // 131)):
        bad = bytearray(good)
        bad[pos] ^= 0x10
        with pytest.raises(FormatError, match=f"{PID:#x}"):
            Root.from_bytes(bytes(bad), pid=PID)
    storage.close()


def _bad(root: Root, **change) -> Root:
    from dataclasses import replace

    out = Root(root.next_seq, root.runs, list(root.ranges))
    out.ranges[0] = replace(out.ranges[0], **change)
    return out


def test_a_malformed_range_list_is_refused_naming_the_page(tmp_path):
    from headrace.pipeline.state.layout import DeletedRange

    storage, reader, root = _ranged_state(tmp_path)
    d = root.ranges[0]
    cases = [
        (_bad(root, hi=d.lo), "not below hi"),
        (_bad(root, lo=d.hi + b"\x00"), "not below hi"),
        (_bad(root, seq=0), "seq 0 is not in"),
        (_bad(root, seq=root.next_seq + 1), "is not in 1 .. next_seq"),
        (Root(root.next_seq, root.runs, [d, DeletedRange(b"", d.lo, d.seq)]), "order"),
        (Root(root.next_seq, root.runs, [DeletedRange(b"", d.lo, d.seq), d]), "touches"),
        (Root(root.next_seq, root.runs, [DeletedRange(b"", d.lo + b"\x00", d.seq), d]),
         "overlaps"),
    ]
    for bad, what in cases:
        with pytest.raises(FormatError, match=what) as e:
            Root.from_bytes(bad.to_bytes(), pid=PID)
        assert e.value.key.startswith(f"state page {PID:#x}") and e.value.offset > 32
    good = bytes(reader.read(PID))[:-4]
    for body, what in ((good[:-1], "key bytes"), (good + b"\x00", "key bytes"),
                       (good[:28] + struct.pack("<I", 5000) + good[32:], "limit"),
                       (good[:28] + struct.pack("<I", 2) + good[32:], "deleted range")):
        with pytest.raises(FormatError, match=what):
            Root.from_bytes(_with_crc(body), pid=PID)
    storage.close()


def test_run_slices_must_share_their_index_page_consistently(tmp_path):
    storage, _reader, root = _ranged_state(tmp_path)
    root.runs[1].index_from += 1  # a slice of another run, or a wrong offset
    with pytest.raises(FormatError, match="shares its index page"):
        Root.from_bytes(root.to_bytes(), pid=PID)
    root.runs[1].index_from -= 1
    root.runs[1].index_seq = root.runs[2].first_seq  # another run's page
    with pytest.raises(FormatError, match="overlap"):
        Root.from_bytes(root.to_bytes(), pid=PID)
    storage.close()
