"""State encoding round trips and fuzzing; corruption of state versions and parts is loud."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import ChecksumMismatch, FormatError
from headrace.persist import PersistClient, make_updates
from headrace.persist.state import (
    CriticalReader,
    LeasedReader,
    PartMeta,
    ShardState,
    decode_state,
    encode_state,
)
from headrace.store import FaultyStore, LocalStore

u64 = st.integers(0, (1 << 64) - 1)
ident = st.text("abcXYZ019-_.", min_size=1, max_size=12)
parts = st.builds(PartMeta, key=ident.map(lambda s: f"persist/shards/s/parts/{s}.parquet"),
                  lower=st.integers(0, 1000), upper=st.integers(1000, 2000), rows=u64, size=u64,
                  crc32=st.integers(0, 0xFFFFFFFF), time_override=st.none() | u64)
states = st.builds(
    ShardState, shard=ident, seqno=st.integers(0, 1 << 40), since=u64, upper=st.none() | u64,
    parts=st.lists(parts, max_size=4).map(tuple),
    leased=st.lists(st.builds(LeasedReader, ident, u64, u64, u64), max_size=3).map(tuple),
    critical=st.lists(st.builds(CriticalReader, ident, u64, st.text(max_size=8)),
                      max_size=2).map(tuple),
    schema=st.none() | st.text(max_size=20), op_id=ident, written_ms=u64)


@given(states)
def test_state_roundtrip(state):
    assert decode_state(encode_state(state), seqno=state.seqno) == state


@settings(max_examples=200, deadline=None)
@given(states, st.data())
def test_state_mutation_fuzz(state, data):
    """Random flips/truncations/insertions: decodes identically or raises FormatError."""
    raw = bytearray(encode_state(state))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        if not raw:
            break
        at = data.draw(st.integers(0, len(raw) - 1))
        if op == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del raw[at:]
        elif op == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        else:
            del raw[at]
    try:
        decoded = decode_state(bytes(raw), key="k", seqno=state.seqno)
    except FormatError as e:
        assert e.key == "k"
        return
    assert decoded == state


def test_state_body_with_bad_fields_is_format_error():
    import json
    import zlib

    from headrace.codec import U16, U32

    def wrap(obj) -> bytes:
        body = json.dumps(obj).encode()
        head = b"HRPS" + U16.pack(1) + U16.pack(0) + U32.pack(len(body))
        return head + body + U32.pack(zlib.crc32(head + body))

    good = json.loads(encode_state(ShardState("s"))[12:-4])
    for field, bad in [("since", -1), ("upper", "x"), ("parts", [["../x", 0, 1, 1, 1, 1, None]]),
                       ("parts", [["k", 5, 1, 1, 1, 1, None]]), ("leased", [[1, 2]]),
                       ("since", 1 << 64), ("schema", 5)]:
        with pytest.raises(FormatError) as ei:
            decode_state(wrap({**good, field: bad}), key="v")
        assert field.split("[")[0] in str(ei.value)


@pytest.fixture
def client(tmp_path):
    return PersistClient(LocalStore(tmp_path / "s"))


def _write(client):
    w = client.open_writer("s")
    w.compare_and_append(make_updates({"k": ["a", "b"]}, [0, 1]), 0, 2)
    return client.state("s")


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupt_part_is_loud(client, how):
    state = _write(client)
    key = state.parts[0].key
    data = bytearray(client.store.get(key).data)
    if how == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[-10:]
    client.store.put(key, bytes(data))
    with pytest.raises((ChecksumMismatch, FormatError)) as ei:
        client.read_only("s").snapshot(1)
    assert ei.value.key == key


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupt_state_version_is_loud(tmp_path, how):
    store = LocalStore(tmp_path / "s")
    _write(PersistClient(store))
    faulty = FaultyStore(store, corrupt_get=how, corrupt_keys=lambda k: "/consensus/0" in k)
    with pytest.raises(FormatError) as ei:
        PersistClient(faulty).upper("s")
    assert "consensus" in ei.value.key


def _wrap_body(body: bytes, version: int = 2) -> bytes:
    import zlib

    from headrace.codec import U16, U32
    head = b"HRPS" + U16.pack(version) + U16.pack(0) + U32.pack(len(body))
    return head + body + U32.pack(zlib.crc32(head + body))


def test_deeply_nested_state_is_format_error_not_recursion_error():
    """Old code: json.loads raised RecursionError on hostile nesting."""
    body = b'{"shard":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(FormatError) as ei:
        decode_state(_wrap_body(body), key="v")
    assert ei.value.key == "v" and "nested" in str(ei.value)


def test_version_1_states_are_still_read():
    import json

    v1 = {"shard": "s", "since": 0, "upper": 3, "leased": [], "critical": [], "schema": None,
          "op_id": "x", "written_ms": 1,
          "parts": [["persist/shards/s/parts/A.parquet", 0, 3, 1, 10, 7, None]]}
    state = decode_state(_wrap_body(json.dumps(v1).encode(), version=1), key="v")
    assert state.parts[0].floor == 0 and state.writers == ()
    with pytest.raises(FormatError):  # v1 with v2 fields, or bad writer ids, are refused
        decode_state(_wrap_body(json.dumps({**v1, "writers": []}).encode(), version=1))
    v2 = {**v1, "parts": [], "writers": [["../x", 1, 1]]}
    with pytest.raises(FormatError) as ei:
        decode_state(_wrap_body(json.dumps(v2).encode()), key="v")
    assert "writers[0]" in str(ei.value)


def test_config_errors_are_headrace_errors(tmp_path):
    from headrace.errors import InvalidInput, InvalidKey
    from headrace.persist import ObjectStoreConsensus

    store = LocalStore(tmp_path / "s")
    for make in (lambda: PersistClient(store, auto_compact_at=4, compact_to=0),
                 lambda: PersistClient(store, auto_compact_at=4, compact_to="2"),
                 lambda: ObjectStoreConsensus(store, hint_every=0),
                 lambda: ObjectStoreConsensus(store, fresh_s=900),
                 lambda: PersistClient(store).compact("s", max_parts=0),
                 lambda: PersistClient(store).sweep(grace_s=-1),
                 lambda: PersistClient(store).open_reader("s", lease_s=0)):
        with pytest.raises(InvalidInput):
            make()
    for root in ("/abs", "a/../b", ""):
        with pytest.raises((InvalidKey, InvalidInput)):
            PersistClient(store, root=root)
    assert PersistClient(store, root="custom/").root == "custom"
