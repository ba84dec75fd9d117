"""Torture, part 3: hostile inputs. Each case runs in its own process (torture_worker.py
``hostile``), so its peak RSS growth over the post-import baseline is its own.

A case must end in a HeadraceError; returning normally means the hostile input was accepted.
Cases go through the public entry points a user or a reader of stored bytes would use, except
the reservoir checkpoint and data-file header cases, which call the format parsers directly.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

GIB = 1 << 30


def warm_up() -> None:
    """Import everything a case may use, so the baseline includes it."""
    import pyarrow  # noqa: F401

    import headrace.backup  # noqa: F401
    import headrace.buffer  # noqa: F401
    import headrace.persist  # noqa: F401
    import headrace.reservoir  # noqa: F401
    import headrace.spine  # noqa: F401


def _store(tmp: str):
    from headrace.store import LocalStore

    return LocalStore(Path(tmp) / "store", fsync=False)


def rle_bomb(blocks: int, declared: int | None = None) -> bytes:
    """A zstd frame of ``blocks`` RLE blocks of 128 KiB each: 4 input bytes per 128 KiB."""
    if declared is None:
        head = struct.pack("<IBB", 0xFD2FB528, 0, (17 - 10) << 3)
    else:
        head = struct.pack("<IBBQ", 0xFD2FB528, 3 << 6, (17 - 10) << 3, declared)
    block = ((128 * 1024) << 3) | (1 << 1)
    return (head + (block.to_bytes(3, "little") + b"\0") * (blocks - 1)
            + (block | 1).to_bytes(3, "little") + b"\0")


# ---- zstd -----------------------------------------------------------------------------------

def zstd_98kb_bomb(tmp):
    from headrace.codec import zstd_decompress

    zstd_decompress(rle_bomb(98_000 // 4), 64 << 20, key="hostile")  # 3 GiB of output


def zstd_declares_16_eib(tmp):
    from headrace.codec import zstd_decompress

    zstd_decompress(rle_bomb(4, declared=1 << 63), 64 << 20, key="hostile")


# ---- buffer ---------------------------------------------------------------------------------

def _queue_with(tmp, batch_bytes: bytes | None = None, location: str = "ingest/X.batch"):
    from headrace.buffer import QueueProducer

    store = _store(tmp)
    if batch_bytes is not None:
        store.put(location, batch_bytes)
    QueueProducer(store, "ingest/manifest").enqueue(location, [])
    return store


def _read_queue(store, **kw):
    from headrace.buffer import read_entries

    return read_entries(store, "ingest/manifest", None, data_path_prefix="ingest", **kw)


def buffer_batch_4gib_bomb(tmp):
    footer = struct.pack("<BIH", 1, 1, 1)  # zstd, one record, version 1
    _read_queue(_queue_with(tmp, rle_bomb(32768) + footer))


def buffer_batch_record_count_2_32(tmp):
    _read_queue(_queue_with(tmp, b"\0" * 64 + struct.pack("<BIH", 0, 0xFFFFFFFF, 1)))


def buffer_batch_1gib_bomb(tmp):
    """A 32 KB batch inflating to 1 GiB: above the consumer's default max_batch_bytes."""
    footer = struct.pack("<BIH", 1, 1, 1)
    _read_queue(_queue_with(tmp, rle_bomb(8192) + footer))


def queue_manifest_entry_count_2_32(tmp):
    from headrace.buffer.manifest_format import encode_footer

    store = _store(tmp)
    store.put("ingest/manifest", b"\0" * 40 + encode_footer(0xFFFFFFFF, 5, 0))
    _read_queue(store)


def _manifest_naming(tmp, location: str):
    from headrace.buffer.manifest_format import encode_entry, encode_footer

    store = _store(tmp)
    store.put("ingest/manifest", encode_entry(0, location, []) + encode_footer(1, 1, 0))
    _read_queue(store)


def queue_manifest_location_dotdot(tmp):
    _manifest_naming(tmp, "../../etc/passwd")


def queue_manifest_location_absolute(tmp):
    _manifest_naming(tmp, "/etc/passwd")


def queue_enqueue_dotdot(tmp):
    _queue_with(tmp, None, "../../etc/passwd")


def queue_enqueue_absolute(tmp):
    _queue_with(tmp, None, "/etc/passwd")


def queue_enqueue_other_prefix(tmp):
    _queue_with(tmp, None, "elsewhere/x.batch")


# ---- reservoir ------------------------------------------------------------------------------

def reservoir_checkpoint_declares_4gib(tmp):
    from headrace.reservoir.formats import checkpoint as ckfmt

    raw_len = 0xFFFFFFFF
    frame = (struct.pack("<IB", 0xFD2FB528, 0b10100000) + struct.pack("<I", raw_len)
             + ((1000 << 3) | 1).to_bytes(3, "little") + b"\0" * 1000)
    ckfmt.decompress(struct.pack("<4sI", b"HRCZ", raw_len) + frame, "hostile.checkpoint",
                     4 << 30, base=100)


def _bundle(tmp) -> tuple[bytes, str]:
    from headrace.reservoir import ReservoirOptions, ReservoirStorage

    store = _store(tmp)
    with ReservoirStorage.open(store, options=ReservoirOptions(registry="bundled")) as st:
        s = st.session()
        s.write(1, b"x" * 100)
        s.commit()
        st.checkpoint()
    (m,) = list(store.list("default/v/default/ckpt/"))
    return store.get(m.key).data, m.key


def reservoir_data_offset_2_63(tmp):
    from headrace.reservoir.formats import datafile

    data, key = _bundle(tmp)
    bad = bytearray(data)
    bad[24:32] = struct.pack("<Q", 1 << 63)
    datafile.parse_index(bytes(bad), key)


def reservoir_stream_dotdot(tmp):
    from headrace.reservoir import ReservoirStorage

    ReservoirStorage.open(_store(tmp), stream="../x")


# ---- persist --------------------------------------------------------------------------------

def persist_state_nested_200k(tmp):
    from headrace.codec import crc32
    from headrace.persist import PersistClient, make_updates
    from headrace.persist.state import MAGIC

    store = _store(tmp)
    c = PersistClient(store)
    c.open_writer("s").compare_and_append(make_updates({"k": [1]}, [0]), 0, 1)
    c.close()
    body = b"[" * 200_000 + b"]" * 200_000
    head = MAGIC + struct.pack("<HHI", 1, 0, len(body))
    hostile = head + body + struct.pack("<I", crc32(head + body))
    versions = [m.key for m in store.list("persist/shards/s/consensus/")
                if m.key.rsplit("/", 1)[1].isdigit()]
    for key in versions:
        store.put(key, hostile)
    PersistClient(store).read_only("s").snapshot(0, timeout_s=0)


def persist_shard_dotdot(tmp):
    from headrace.persist import PersistClient

    PersistClient(_store(tmp)).open_writer("../x")


# ---- spine ----------------------------------------------------------------------------------

def _spine_checkpoint(tmp) -> tuple[Path, str]:
    import pyarrow as pa

    from headrace.spine import Batch, Circuit

    root = Path(tmp) / "spine"
    with Circuit.open(root, "fp") as c:
        c.spine("s", pa.int64(), pa.int64()).insert(Batch.from_pydict([1, 5], [0, 0], [1, 1]))
        return root, c.commit()


def spine_manifest_nested_200k(tmp):
    from headrace.codec import crc32
    from headrace.spine import Circuit
    from headrace.spine.catalog import MANIFEST_MAGIC, VERSION

    root, ck = _spine_checkpoint(tmp)
    body = b"[" * 200_000 + b"]" * 200_000
    (root / ck / "spine-s.dat").write_bytes(
        struct.pack("<4sHHI", MANIFEST_MAGIC, VERSION, 0, len(body))
        + struct.pack("<I", crc32(body)) + body)
    Circuit.open(root, "fp").close()


def spine_catalog_count_2_32(tmp):
    from headrace.codec import crc32
    from headrace.spine import Circuit
    from headrace.spine.catalog import CATALOG_MAGIC, VERSION

    root, _ck = _spine_checkpoint(tmp)
    head = struct.pack("<4sHHI", CATALOG_MAGIC, VERSION, 0, 0xFFFFFFFF)
    (root / "checkpoints.headrace").write_bytes(head + struct.pack("<I", crc32(head)))
    Circuit.open(root, "fp").close()


def spine_manifest_field_wrong_type(tmp):
    from headrace.codec import crc32
    from headrace.spine import Circuit
    from headrace.spine.catalog import MANIFEST_MAGIC, VERSION

    root, ck = _spine_checkpoint(tmp)
    body = json.dumps({"name": "s", "key_type": "int64", "val_type": "int64",
                       "batches": 7, "lower_bound": None}).encode()
    (root / ck / "spine-s.dat").write_bytes(
        struct.pack("<4sHHI", MANIFEST_MAGIC, VERSION, 0, len(body))
        + struct.pack("<I", crc32(body)) + body)
    Circuit.open(root, "fp").close()


def spine_batch_row_count_2_62(tmp):
    from headrace.codec import crc32
    from headrace.spine import Batch
    from headrace.spine.format import FOOTER, FOOTER_CRC_SPAN

    data = bytearray(Batch.from_pydict(list(range(100)), [0] * 100, [1] * 100).to_bytes())
    at = len(data) - FOOTER.size
    data[at:at + 8] = struct.pack("<Q", 1 << 62)
    data[at + FOOTER_CRC_SPAN:at + FOOTER_CRC_SPAN + 4] = struct.pack(
        "<I", crc32(bytes(data[at:at + FOOTER_CRC_SPAN])))
    Batch.from_bytes(bytes(data))


def spine_lower_bound_wrong_type(tmp):
    from headrace.spine import Batch

    Batch.merge([Batch.from_pydict([1], [1], [1])], lower_bound="x")


# ---- backup ---------------------------------------------------------------------------------

def _backup_renaming(tmp, new_name: str):
    """A genuine index whose file name is replaced in the JSON (CRC recomputed), so the
    reader, not the encoder, meets it."""
    from headrace.backup import BackupManager, RestoreManager
    from headrace.backup.index import FORMAT_NAME
    from headrace.codec import crc32

    src = Path(tmp) / "src"
    src.mkdir()
    (src / "a.sst").write_bytes(b"a" * 100)
    store = _store(tmp)
    with BackupManager(store, prefix="bk") as bm:
        index_id = bm.upload(src, checkpoint_id="1")
        bm.cleanup(index_id)
    (key,) = [m.key for m in store.list("bk/index/")]
    data = store.get(key).data
    marker = b'"snapshotIndex":'
    body = data[data.index(marker) + len(marker):-1].replace(b'"a.sst"',
                                                             json.dumps(new_name).encode())
    head = f'{{"format":"{FORMAT_NAME}","crc32":"{crc32(body):08x}","snapshotIndex":'
    store.put(key, head.encode() + body + b"}")
    target = Path(tmp) / "deep" / "target"
    target.parent.mkdir()
    with RestoreManager(store, prefix="bk") as rm:
        rm.restore(index_id, target)


def backup_index_name_dotdot(tmp):
    _backup_renaming(tmp, "../escaped")


def backup_index_name_absolute(tmp):
    _backup_renaming(tmp, str(Path(tmp) / "escaped-abs"))


def backup_prefix_dotdot(tmp):
    from headrace.backup import BackupManager

    BackupManager(_store(tmp), prefix="../x")


# ---- store keys -----------------------------------------------------------------------------

def store_key_dotdot(tmp):
    _store(tmp).put("../x", b"x")


def store_key_absolute(tmp):
    _store(tmp).put("/tmp/x", b"x")


def store_key_4kib(tmp):
    _store(tmp).put("a/" + "b" * 4096, b"x")


def store_key_nul(tmp):
    _store(tmp).get("a\0b")


def store_prefix_leading_slash(tmp):
    from headrace.store import PrefixedStore

    PrefixedStore(_store(tmp), "/abs")


CASES = {f.__name__: f for f in [
    zstd_98kb_bomb, zstd_declares_16_eib, buffer_batch_4gib_bomb, buffer_batch_record_count_2_32,
    queue_manifest_entry_count_2_32, queue_manifest_location_dotdot,
    queue_manifest_location_absolute, queue_enqueue_dotdot, queue_enqueue_absolute,
    queue_enqueue_other_prefix, reservoir_checkpoint_declares_4gib, reservoir_data_offset_2_63,
    reservoir_stream_dotdot, persist_state_nested_200k, persist_shard_dotdot,
    spine_manifest_nested_200k, spine_catalog_count_2_32, spine_manifest_field_wrong_type,
    spine_batch_row_count_2_62, spine_lower_bound_wrong_type, backup_index_name_dotdot,
    backup_index_name_absolute, backup_prefix_dotdot, store_key_dotdot, store_key_absolute,
    store_key_4kib, store_key_nul, store_prefix_leading_slash, buffer_batch_1gib_bomb,
]}
