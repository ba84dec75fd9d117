"""ShardMachine: the cached state of one shard and the compare-and-set loop that advances it.

Every change to a shard (append, reader registration, since downgrade, compaction) is a pure
function ``state -> next state`` run by :meth:`ShardMachine.apply`: encode the next state, CAS
it in as version seqno+1, and on a lost race fetch the head and run the function again on the
fresh state (it may now refuse, e.g. with UpperMismatch). Expired leases — of readers and of
writers — are dropped on every change, so since advances even when a leased reader dies, and the
parts a dead writer uploaded become collectable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from headrace.codec import Clock, new_ulid
from headrace.errors import FormatError
from headrace.persist.consensus import Consensus
from headrace.persist.errors import ConsensusContended
from headrace.persist.state import ShardState, decode_state, encode_state
from headrace.retry import RetryPolicy

log = logging.getLogger("headrace.persist")

CAS_RETRY = RetryPolicy(max_attempts=200, base_delay_s=0.002, max_delay_s=0.1,
                        max_elapsed_s=120.0)


def drop_expired(state: ShardState, now_ms: int) -> ShardState:
    """``state`` without the leased readers and writers whose lease ran out at ``now_ms``."""
    live = [r for r in state.leased if not r.expired(now_ms)]
    if len(live) != len(state.leased):
        log.info("shard %s: dropping %d expired leased readers", state.shard,
                 len(state.leased) - len(live))
        state = state.with_readers(leased=live)
    writers = tuple(w for w in state.writers if not w.expired(now_ms))
    if len(writers) != len(state.writers):
        log.info("shard %s: dropping %d expired writers", state.shard,
                 len(state.writers) - len(writers))
        state = replace(state, writers=writers)
    return state


class ShardMachine:
    def __init__(self, consensus: Consensus, shard: str, clock: Clock,
                 retry: RetryPolicy = CAS_RETRY):
        self.consensus = consensus
        self.shard = shard
        self.clock = clock
        self.retry = retry
        self.lock = threading.RLock()
        self._state: ShardState | None = None
        self.metrics = {"fetches": 0, "cas_ok": 0, "cas_retries": 0}

    def fetch(self) -> ShardState:
        """Read the head version (linearizable) and cache it."""
        head = self.consensus.head(self.shard)
        self.metrics["fetches"] += 1
        if head is None:
            state = ShardState(self.shard)
        else:
            vkey = getattr(self.consensus, "version_key", None)
            key = vkey(self.shard, head.seqno) if vkey else self.shard
            state = decode_state(head.data, key=key, seqno=head.seqno)
            if state.shard != self.shard:
                raise FormatError(key, None, f"state names shard {state.shard!r}")
        with self.lock:
            if self._state is None or state.seqno >= self._state.seqno:
                self._state = state
        return state

    def current(self) -> ShardState:
        with self.lock:
            cached = self._state
        return cached if cached is not None else self.fetch()

    def apply(self, step: Callable[[ShardState], ShardState | None], *,
              fresh: bool = False) -> ShardState:
        """Run ``step`` on the latest state until its result lands; None means no change."""
        with self.lock:
            state = self.fetch() if fresh else self.current()
            for attempt in self.retry.delays():
                nxt = step(state)
                if nxt is None:
                    return state
                now = self.clock.now_ms()
                nxt = drop_expired(nxt, now)
                nxt = replace(nxt, op_id=new_ulid(), written_ms=now, seqno=state.seqno + 1)
                expected = state.seqno if state.seqno > 0 else None
                if self.consensus.compare_and_set(self.shard, expected, encode_state(nxt)):
                    self._state = nxt
                    self.metrics["cas_ok"] += 1
                    return nxt
                self.metrics["cas_retries"] += 1
                log.debug("shard %s: CAS at seqno %d lost (attempt %d)", self.shard,
                          state.seqno, attempt)
                state = self.fetch()
        raise ConsensusContended(f"shard {self.shard!r}: state CAS kept losing")
