"""ConsensusTests: the Consensus contract (headrace.persist.consensus) as tests.

Subclass it and provide a ``consensus`` fixture yielding an empty Consensus. Covers: empty heads,
seqnos growing by one, exactly one winner per expected seqno (threads), scans, truncation and the
zombie rule (a Create below the floor never becomes visible).
"""

from __future__ import annotations

import threading

import pytest

from headrace.errors import InvalidInput


class ConsensusTests:
    def test_empty_head_is_none(self, consensus):
        assert consensus.head("s") is None
        assert consensus.scan("s", 0, 10) == []

    def test_first_write_expects_none(self, consensus):
        assert consensus.compare_and_set("s", None, b"v1")
        assert not consensus.compare_and_set("s", None, b"again")
        head = consensus.head("s")
        assert (head.seqno, head.data) == (1, b"v1")

    def test_seqnos_grow_by_one_and_stale_expectations_lose(self, consensus):
        for i in range(1, 40):
            assert consensus.compare_and_set("s", i - 1 if i > 1 else None, f"v{i}".encode())
        assert consensus.head("s").seqno == 39
        assert not consensus.compare_and_set("s", 10, b"stale")
        assert consensus.head("s").data == b"v39"
        assert [v.seqno for v in consensus.scan("s", 30, 5)] == [30, 31, 32, 33, 34]
        assert [v.data for v in consensus.scan("s", 38, 10)] == [b"v38", b"v39"]

    def test_keys_are_independent(self, consensus):
        assert consensus.compare_and_set("a", None, b"a1")
        assert consensus.compare_and_set("b", None, b"b1")
        assert consensus.compare_and_set("b", 1, b"b2")
        assert consensus.head("a").seqno == 1 and consensus.head("b").seqno == 2
        assert sorted(consensus.list_keys()) == ["a", "b"]

    def test_one_winner_per_expected_seqno_under_threads(self, consensus):
        consensus.compare_and_set("race", None, b"base")
        wins: list[tuple[int, int]] = []
        lock = threading.Lock()

        def racer(me: int):
            for _ in range(6):
                head = consensus.head("race")
                if consensus.compare_and_set("race", head.seqno, f"{me}@{head.seqno}".encode()):
                    with lock:
                        wins.append((head.seqno, me))

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seqnos = [s for s, _ in wins]
        assert len(seqnos) == len(set(seqnos))  # never two winners for one expected seqno
        head = consensus.head("race")
        assert head.seqno == 1 + len(wins)
        for v in consensus.scan("race", 2, 1000):
            who, at = v.data.decode().split("@")
            assert (int(at), int(who)) in wins and int(at) == v.seqno - 1

    def test_truncate_keeps_head_and_refuses_zombies(self, consensus):
        for i in range(1, 21):
            consensus.compare_and_set("t", i - 1 or None, f"v{i}".encode())
        assert consensus.truncate("t", 15) == 14
        assert consensus.head("t").seqno == 20
        assert consensus.scan("t", 0, 100)[0].seqno == 15
        # a writer that still believes the head is 3 must lose, not resurrect version 4
        assert not consensus.compare_and_set("t", 3, b"zombie")
        assert consensus.head("t").data == b"v20"
        assert consensus.compare_and_set("t", 20, b"v21")
        with pytest.raises(InvalidInput):
            consensus.truncate("t", 99)

    def test_truncate_is_idempotent(self, consensus):
        for i in range(1, 6):
            consensus.compare_and_set("i", i - 1 or None, b"x%d" % i)
        consensus.truncate("i", 4)
        assert consensus.truncate("i", 3) == 0
        assert consensus.head("i").seqno == 5
