"""The queue manifest (RFC 0001): entries appended without decoding, 22-byte footer.

Layout (little-endian)::

    entry × entry_count:
        entry_len u32 (bytes after this field) | sequence u64 | location_len u16 | location
        | metadata_count u32 | (start_index u32 | ingestion_time_ms i64 | payload_len u32
        | payload) × metadata_count
    footer (22 bytes): entry_count u32 | next_sequence u64 | epoch u64 | version u16 (= 1)

Appending (``append_entry``) strips the footer of a ``bytearray`` in place, appends the encoded
entry and a new footer: O(1) in the number of entries, no existing entry is read. Decoding
(``decode_manifest``) validates every length against the bytes present, that sequences are
contiguous and end at ``next_sequence - 1``, and that locations are UTF-8. Whether a location
is a key the queue may read is checked per entry by its readers (``locations.py``), so one bad
entry does not make the whole manifest undecodable. See docs/formats/queue-manifest.md.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from headrace.buffer.types import ManifestEntry, Metadata
from headrace.errors import FormatError, InvalidInput

VERSION = 1
FOOTER = struct.Struct("<IQQH")
FOOTER_SIZE = FOOTER.size  # 22
ENTRY_HEAD = struct.Struct("<IQH")  # entry_len, sequence, location_len
META_HEAD = struct.Struct("<IqI")  # start_index, ingestion_time_ms, payload_len
U32 = struct.Struct("<I")
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1


@dataclass(frozen=True)
class Footer:
    entry_count: int
    next_sequence: int
    epoch: int
    version: int = VERSION


@dataclass(frozen=True)
class Manifest:
    """A fully decoded manifest."""

    entries: list[ManifestEntry]
    next_sequence: int
    epoch: int

    @property
    def first_sequence(self) -> int | None:
        return self.entries[0].sequence if self.entries else None


def encode_footer(entry_count: int, next_sequence: int, epoch: int) -> bytes:
    return FOOTER.pack(entry_count, next_sequence, epoch, VERSION)


EMPTY_MANIFEST = encode_footer(0, 0, 0)


def read_footer(buf, key: str | None = None) -> Footer:
    """The footer only (last 22 bytes): O(1), used on every append and epoch check."""
    n = len(buf)
    if n < FOOTER_SIZE:
        raise FormatError(key, 0, f"manifest is {n} bytes, shorter than its 22-byte footer")
    count, next_seq, epoch, version = FOOTER.unpack_from(buf, n - FOOTER_SIZE)
    if version != VERSION:
        raise FormatError(key, n - 2, f"unknown manifest version {version} (expected {VERSION})")
    return Footer(count, next_seq, epoch, version)


def encode_entry(sequence: int, location: str, metadata: Iterable[Metadata]) -> bytes:
    """One entry, ``entry_len`` prefix included."""
    loc = location.encode("utf-8")
    if len(loc) > 0xFFFF:
        raise InvalidInput(f"location is {len(loc)} bytes, the manifest allows 65535")
    parts = [b"", struct.pack("<QH", sequence, len(loc)), loc, b""]
    count = 0
    for md in metadata:
        payload = bytes(md.payload)
        if not 0 <= md.start_index <= U32_MAX:
            raise InvalidInput(f"metadata start_index {md.start_index} is not a u32")
        if len(payload) > U32_MAX:
            raise InvalidInput("metadata payload longer than 2**32-1 bytes")
        parts.append(META_HEAD.pack(md.start_index, md.ingestion_time_ms, len(payload)))
        parts.append(payload)
        count += 1
    parts[3] = U32.pack(count)
    body_len = sum(map(len, parts))
    if body_len > U32_MAX:
        raise InvalidInput("manifest entry longer than 2**32-1 bytes")
    parts[0] = U32.pack(body_len)
    return b"".join(parts)


def append_entry(buf: bytearray, location: str, metadata: Iterable[Metadata],
                 key: str | None = None) -> int:
    """Append an entry to ``buf`` in place and return its sequence; never decodes entries."""
    footer = read_footer(buf, key)
    seq = footer.next_sequence
    if seq >= U64_MAX or footer.entry_count >= U32_MAX:
        raise FormatError(key, len(buf) - FOOTER_SIZE, "manifest sequence or entry count is "
                          "exhausted")
    entry = encode_entry(seq, location, metadata)
    del buf[-FOOTER_SIZE:]
    buf += entry
    buf += encode_footer(footer.entry_count + 1, seq + 1, footer.epoch)
    return seq


def set_epoch(buf: bytearray, epoch: int, key: str | None = None) -> None:
    """Rewrite the footer's epoch in place."""
    f = read_footer(buf, key)
    buf[-FOOTER_SIZE:] = encode_footer(f.entry_count, f.next_sequence, epoch & U64_MAX)


def _entry_heads(buf, key: str | None, footer: Footer) -> Iterator[tuple[int, int, int]]:
    """(offset, entry_len, sequence) per entry, checking lengths and sequence contiguity."""
    end = len(buf) - FOOTER_SIZE
    pos = 0
    prev = None
    for i in range(footer.entry_count):
        if end - pos < ENTRY_HEAD.size:
            raise FormatError(key, pos, f"entry {i}: header needs {ENTRY_HEAD.size} bytes, "
                              f"{end - pos} present before the footer")
        entry_len, seq, _ = ENTRY_HEAD.unpack_from(buf, pos)
        if entry_len > end - pos - 4:
            raise FormatError(key, pos, f"entry {i}: entry_len {entry_len} exceeds the "
                              f"{end - pos - 4} bytes present")
        if prev is not None and seq != prev + 1:
            raise FormatError(key, pos + 4, f"entry {i}: sequence {seq} does not follow {prev}")
        yield pos, entry_len, seq
        prev = seq
        pos += 4 + entry_len
    if pos != end:
        raise FormatError(key, pos, f"{end - pos} bytes after entry {footer.entry_count} "
                          "(the footer's entry_count) before the footer")
    if prev is not None and prev + 1 != footer.next_sequence:
        raise FormatError(key, end + 4, f"next_sequence {footer.next_sequence} does not follow "
                          f"the last entry's sequence {prev}")


def _decode_location(buf, key: str | None, p: int, end: int) -> tuple[str, int]:
    """The location starting at ``p`` (its u16 length first) and the offset after it."""
    (loc_len,) = struct.unpack_from("<H", buf, p)
    p += 2
    if loc_len > end - p:
        raise FormatError(key, p - 2, f"location_len {loc_len} exceeds the entry")
    try:  # whether the location is a key this queue may read is the reader's check
        location = bytes(buf[p : p + loc_len]).decode("utf-8")  # (locations.py), per entry
    except UnicodeDecodeError as e:
        raise FormatError(key, p, f"location is not UTF-8: {e.reason}") from e
    return location, p + loc_len


def _decode_entry(buf, key: str | None, pos: int, entry_len: int, seq: int) -> ManifestEntry:
    end = pos + 4 + entry_len
    p = pos + 4 + 8
    if end - p < 2:
        raise FormatError(key, p, "entry too short for location_len")
    location, p = _decode_location(buf, key, p, end)
    if end - p < 4:
        raise FormatError(key, p, "entry too short for metadata_count")
    (md_count,) = U32.unpack_from(buf, p)
    p += 4
    if md_count * META_HEAD.size > end - p:
        raise FormatError(key, p - 4, f"metadata_count {md_count} needs at least "
                          f"{md_count * META_HEAD.size} bytes, the entry has {end - p}")
    items = _uniform_metadata(buf, p, end, md_count)
    if items is not None:
        return ManifestEntry(seq, location, items)
    items = []
    for j in range(md_count):
        if end - p < META_HEAD.size:
            raise FormatError(key, p, f"metadata {j}: header past the entry end")
        start, t_ms, plen = META_HEAD.unpack_from(buf, p)
        p += META_HEAD.size
        if plen > end - p:
            raise FormatError(key, p - 4, f"metadata {j}: payload_len {plen} exceeds the entry")
        items.append(Metadata(start, t_ms, bytes(buf[p : p + plen])))
        p += plen
    if p != end:
        raise FormatError(key, p, f"entry_len {entry_len} leaves {end - p} unparsed bytes")
    return ManifestEntry(seq, location, tuple(items))


def _uniform_metadata(buf, p: int, end: int, count: int) -> tuple[Metadata, ...] | None:
    """Fast path, no Python loop over the bytes: every item's payload has the first one's
    length (one produce call per item, usually with an empty or fixed-size payload), so the
    items lie at a fixed stride. None when they do not: the item-by-item walk decides."""
    if count < 2 or end - p < META_HEAD.size:
        return None
    (plen,) = U32.unpack_from(buf, p + 12)
    stride = META_HEAD.size + plen
    if end - p != count * stride:
        return None
    rows = np.ndarray((count,), dtype=np.dtype({
        "names": ["start", "time", "plen"], "formats": ["<u4", "<i8", "<u4"],
        "offsets": [0, 4, 12], "itemsize": stride}), buffer=buf, offset=p)
    if not np.all(rows["plen"] == plen):
        return None
    if plen:
        payloads = np.ndarray((count,), dtype=f"V{plen}", buffer=buf, offset=p + 16,
                              strides=(stride,)).tolist()
    else:
        payloads = [b""] * count
    return tuple(map(Metadata, rows["start"].tolist(), rows["time"].tolist(), payloads))


def decode_manifest(buf, key: str | None = None) -> Manifest:
    """Decode and validate a whole manifest."""
    footer = read_footer(buf, key)
    if footer.entry_count * (ENTRY_HEAD.size + 4) > len(buf):
        raise FormatError(key, len(buf) - FOOTER_SIZE, f"entry_count {footer.entry_count} "
                          f"cannot fit in {len(buf)} bytes")
    entries = [_decode_entry(buf, key, pos, n, seq)
               for pos, n, seq in _entry_heads(buf, key, footer)]
    return Manifest(entries, footer.next_sequence, footer.epoch)


def entry_after(buf, sequence: int, key: str | None = None) -> ManifestEntry | None:
    """The first entry with a sequence above ``sequence``, decoding only that entry.

    Walks entry headers (validated) until it finds it; the consumer calls this on every
    ``next_batch``, so it must not pay for the metadata of the whole queue.
    """
    footer = read_footer(buf, key)
    for pos, n, seq in _entry_heads(buf, key, footer):
        if seq > sequence:
            return _decode_entry(buf, key, pos, n, seq)
    return None


def location_after(buf, sequence: int, key: str | None = None) -> tuple[int, str] | None:
    """Sequence and location of the first entry above ``sequence``, its metadata not decoded:
    all the consumer's read-ahead needs to start reading that batch."""
    footer = read_footer(buf, key)
    for pos, n, seq in _entry_heads(buf, key, footer):
        if seq > sequence:
            end = pos + 4 + n
            if end - (pos + 12) < 2:
                raise FormatError(key, pos + 12, "entry too short for location_len")
            return seq, _decode_location(buf, key, pos + 12, end)[0]
    return None


def encode_manifest(manifest: Manifest) -> bytes:
    parts = [encode_entry(e.sequence, e.location, e.metadata) for e in manifest.entries]
    parts.append(encode_footer(len(manifest.entries), manifest.next_sequence, manifest.epoch))
    return b"".join(parts)


def drop_through(buf, through_sequence: int, key: str | None = None) -> tuple[bytes, int]:
    """A manifest without the entries of sequence <= ``through_sequence`` (and how many went).

    Walks entry headers only; kept entries are copied as raw bytes.
    """
    footer = read_footer(buf, key)
    cut = 0
    dropped = 0
    for pos, n, seq in _entry_heads(buf, key, footer):
        if seq > through_sequence:
            break
        cut = pos + 4 + n
        dropped += 1
    if dropped == 0:
        return bytes(buf), 0
    body = bytes(buf[cut : len(buf) - FOOTER_SIZE])
    return body + encode_footer(footer.entry_count - dropped, footer.next_sequence,
                                footer.epoch), dropped
