"""torture: SIGKILLs, contention, corruption, hostile input and store faults (issue 15).

What it does, in order (every check reads the store alone, after the fact):
  1. SIGKILL loops: buffer producers (killed after a random number of durable produce calls),
     buffer consumers (killed mid-stream, restarted from the last sequence in their fsynced
     sink), two reservoir writers racing on one stream (both killed at random moments each
     cycle, registry "bundled" and "file" alternately), and the demo pipeline
     (headrace.testing.pipeline_kill: the whole process group, Spark JVM included).
  2. 8-way contention (8 processes): producers on one queue manifest, compare_and_append
     writers on one persist shard, checkpointing writers on one reservoir stream.
  3. The corruption sweep over every file type (torture_sweep.py).
  4. The hostile-input suite, one process per case with its peak RSS (torture_hostile.py).
  5. A FaultyStore (transient failures + lost replies) under a producer and a consumer, and
     under persist writers racing on one shard.

Figures (targets): acked_lost 0 (acknowledged data missing), acked_duplicated 0 (delivered or
stored twice), committed_damaged 0 (a committed checkpoint/state/output that reads wrong or
not at all), silent_wrong_reads 0 and untyped_errors 0 (sweep + hostile suite),
hostile_max_rss_mib <= 256 (largest RSS growth of a case that must be refused); and what was
tried: kills, mutations, faults, hostile_cases. Failures are listed on stderr with details.

Full: 12 producer kills, 12 consumer kills, 8 reservoir cycles per registry mode (32 kills),
6 pipeline kills (6,000 orders), 8 x 600 produce calls, a persist race to 40, 8 x 6 reservoir
checkpoints, ~170 mutations per file (3 files per type), 2,000 faulty produce calls, a faulty
persist race to 120. --quick: 8, 6, 5 (20 kills), 1 (800 orders), 8 x 100, 10, 8 x 2, ~45 per
file (1 per type), 400, 25: at least 30 kills and 600 mutations, within 5 minutes on a 2-core
machine, most of it the one pipeline run (Spark starts in ~10 s idle, minutes under load).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parse_args, report, scratch_dir  # noqa: E402
from torture_faults import faulty_buffer, faulty_persist  # noqa: E402
from torture_hostile import CASES  # noqa: E402
from torture_sweep import corruption_sweep  # noqa: E402

from headrace.errors import HeadraceError  # noqa: E402
from headrace.store import LocalStore  # noqa: E402

WORKER = str(Path(__file__).with_name("torture_worker.py"))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]))


class Tally:
    """The figures, plus a line per failure for stderr."""

    def __init__(self):
        self.n = Counter()
        self.failures: list[str] = []

    def bad(self, key: str, count: int, what: str) -> None:
        if count:
            self.n[key] += count
            self.failures.append(f"{key} +{count}: {what}")


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


class Lines:
    """A child's stdout lines, collected by a thread (the parent stays free to kill it)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self.cv = proc, [], threading.Condition()
        threading.Thread(target=self._pump, daemon=True, name="torture-lines").start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)
            self.cv.notify_all()

    def wait_for(self, n: int, timeout: float = 120) -> None:
        """Until ``n`` lines arrived or the child ended."""
        with self.cv:
            self.cv.wait_for(lambda: len(self.lines) >= n or None in self.lines, timeout)

    def done(self, t: Tally | None = None) -> list[str]:
        """Its lines once it ended; with ``t``, an exit other than 0 or SIGKILL is counted
        (``worker_errors``) with the end of its stderr."""
        self.proc.wait()
        self.wait_for(10**9, 30)
        if t is not None:
            rc = self.proc.returncode
            t.bad("worker_errors", int(rc not in (0, -signal.SIGKILL)),
                  f"{self.proc.args[2:5]} exited {rc}: {self.proc.stderr.read()[-600:]}")
        return [x for x in self.lines if x is not None]


def kill(proc: subprocess.Popen) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---- 1. SIGKILL loops ----------------------------------------------------------------------

def _queue_contents(url: str) -> list[tuple[int, list[str]]]:
    from headrace.buffer import read_entries

    return [(b.sequence, [e.decode() for e in b.entries])
            for b in read_entries(LocalStore(url, fsync=False), "ingest/manifest", None)]


def kill_producers(work: Path, cycles: int, rng: random.Random, t: Tally) -> list[str]:
    """Producers killed after a random number of durable calls; returns every acked entry."""
    url = str(work / "queue")
    acked: list[str] = []
    for k in range(cycles):
        lines = Lines(spawn("produce", url, f"p{k}", "100000"))
        lines.wait_for(rng.randint(1, 400))
        kill(lines.proc)
        acked += [f"p{k}:{x.split()[1]}" for x in lines.done(t) if x.startswith("D ")]
        t.n["kills"] += 1
        stored = [e for _, es in _queue_contents(url) for e in es]
        counts = Counter(stored)
        t.bad("acked_lost", len(set(acked) - set(counts)),
              f"producer kill {k}: durable entries missing from the queue")
        t.bad("acked_duplicated", sum(c - 1 for c in counts.values()),
              f"producer kill {k}: entries enqueued twice")
        for p in {e.split(":")[0] for e in stored}:  # each producer's calls: a prefix, in order
            mine = [int(e.split(":")[1]) for e in stored if e.split(":")[0] == p]
            t.bad("committed_damaged", int(mine != list(range(len(mine)))),
                  f"producer kill {k}: {p}'s entries are not a prefix in order")
    return acked


def _sink(path: Path) -> list[tuple[int, list[str]]]:
    text = path.read_text() if path.exists() else ""
    out = []
    for line in text[: text.rfind("\n") + 1].splitlines():  # a cut last line was never acked
        seq, _, entries = line.partition(" ")
        out.append((int(seq), entries.split(",") if entries else []))
    return out


def kill_consumers(work: Path, cycles: int, rng: random.Random, t: Tally) -> None:
    """Consume the queue the producers left, SIGKILLing the consumer mid-stream each cycle."""
    url, sink = str(work / "queue"), work / "sink.txt"
    expected = Counter(e for _, es in _queue_contents(url) for e in es)
    total = len(_queue_contents(url))
    for k in range(cycles + 1):
        got = _sink(sink)
        last = str(got[-1][0]) if got else "none"
        proc = spawn("consume", url, str(sink), last)
        if k < cycles:
            target = len(got) + rng.randint(1, max(total // (cycles + 1), 2))
            deadline = time.monotonic() + 120
            while len(_sink(sink)) < target and proc.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.005)  # polling the sink: the kill moment is meant to be random
            kill(proc)
            t.n["kills"] += 1
        else:
            proc.wait(300)
            t.bad("committed_damaged", int(proc.returncode != 0),
                  f"final consumer exit {proc.returncode}: {proc.stderr.read()[-400:]}")
        got = _sink(sink)
        seqs = [s for s, _ in got]
        t.bad("acked_duplicated", len(seqs) - len(set(seqs)),
              f"consumer cycle {k}: a sequence delivered twice")
        remaining = _queue_contents(url)
        seen = Counter(e for _, es in got for e in es) + \
            Counter(e for s, es in remaining if s > (seqs[-1] if seqs else -1) for e in es)
        t.bad("acked_lost", sum((expected - seen).values()),
              f"consumer cycle {k}: entries neither delivered nor still queued")
    final = Counter(e for _, es in _sink(sink) for e in es)
    t.bad("acked_lost", sum((expected - final).values()), "entries never delivered")
    t.bad("acked_duplicated", sum((final - expected).values()), "entries delivered twice")


def _check_reservoir(url: str, registry: str, acked: dict[int, set[str]], t: Tally,
                     where: str) -> int:
    """The newest checkpoint: version >= every acked one, every page from one checkpoint."""
    from torture_worker import PAGES, page

    from headrace.reservoir import ReservoirOptions, ReservoirReader
    from headrace.reservoir.verify import verify_stream

    opts = ReservoirOptions(max_file_size=16384, registry=registry, snapshot_interval=4)
    store = LocalStore(url, fsync=False)
    try:
        with ReservoirReader.open(store, options=opts) as r:
            version = r.version
            pages = [bytes(r.read(p)) for p in range(PAGES)] if version else []
        ok = verify_stream(store, options=opts).ok
    except HeadraceError as e:
        t.bad("committed_damaged", 1, f"{where}: the stream does not read: {e!r}")
        return 0
    t.bad("committed_damaged", int(not ok), f"{where}: verify_stream failed")
    t.bad("acked_duplicated", sum(len(v) - 1 for v in acked.values()),
          f"{where}: a version acknowledged to two writers {acked}")
    newest = max(acked, default=0)
    t.bad("acked_lost", int(version < newest),
          f"{where}: stream at version {version}, version {newest} was acknowledged")
    if pages:
        tag = pages[0].split(b"|", 1)[0].decode()
        t.bad("committed_damaged", int(pages != [page(tag, p) for p in range(PAGES)]),
              f"{where}: version {version} mixes pages of several checkpoints")
        want = acked.get(version)
        t.bad("committed_damaged", int(bool(want) and tag not in want),
              f"{where}: version {version} holds {tag}, acknowledged as {want}")
    return version


def kill_reservoir_writers(work: Path, cycles: int, rng: random.Random, t: Tally) -> None:
    """Two writers of one stream race; each cycle both are SIGKILLed at random moments."""
    for registry in ("bundled", "file"):
        url = str(work / f"reservoir-{registry}")
        acked: dict[int, set[str]] = {}
        for k in range(cycles):
            procs = [Lines(spawn("reservoir", url, registry, f"{registry[0]}{k}{w}", "100000"))
                     for w in "ab"]
            procs[0].wait_for(rng.randint(1, 6))
            for lines in procs:
                time.sleep(rng.uniform(0, 0.3))  # a random moment, not an interleaving
                kill(lines.proc)
                t.n["kills"] += 1
            for lines in procs:
                for x in lines.done(t):
                    if x.startswith("C "):
                        _, v, tag = x.split()
                        acked.setdefault(int(v), set()).add(tag)
            _check_reservoir(url, registry, acked, t, f"reservoir {registry} cycle {k}")


def kill_pipeline(work: Path, kills: int, rng: random.Random, t: Tally) -> None:
    from headrace.persist import PersistClient
    from headrace.spark.demo import OUTPUT_SHARD, DemoSpec, encode, generate_events, produce
    from headrace.testing.pipeline_kill import run_and_kill, run_to_end

    spec = DemoSpec(seed=13, customers=30, orders=800 if kills < 4 else 6000)
    root = str(work / "pipeline")
    payloads = encode(generate_events(spec))
    # quick: 3 queue entries (one committed before the kill, two after); full: 2 per kill + 3
    step = len(payloads) // (kills * 2 + 3 if kills >= 4 else 3) + 1
    for i in range(0, len(payloads), step):
        produce(root, payloads[i: i + step])
    common = ["--root", root, "--partitions", "2", "--checkpoint-dir",
              str(work / "spark-ckpt"), "--batches-per-trigger", "1"]
    upper = 0
    for k in range(kills):
        run_and_kill(common, rng, max_delay_s=3.0)
        t.n["kills"] += 1
        try:  # the output shard reads, and its upper (committed times) never went back
            client = PersistClient(root)
            now = client.upper(OUTPUT_SHARD) or 0
            if now:
                client.read_only(OUTPUT_SHARD).snapshot(now - 1, timeout_s=0)
            client.close()
        except HeadraceError as e:
            t.bad("committed_damaged", 1, f"pipeline kill {k}: output shard unreadable: {e!r}")
            continue
        t.bad("acked_lost", int(now < upper), f"pipeline kill {k}: upper {upper} -> {now}")
        upper = max(upper, now)
    end = run_to_end([*common, "--until-idle", "--verify-seed", str(spec.seed),
                      "--customers", str(spec.customers), "--orders", str(spec.orders)])
    verified = end.get("verified", {})
    t.bad("committed_damaged", int(not verified.get("ok")),
          f"pipeline after {kills} kill(s): worker exit {end.get('returncode')}, "
          f"{end.get('batches')} batches, recovered={'recovered' in end}, verified: "
          f"{json.dumps(verified)[:300]} (a crash: run the worker by hand, stderr is discarded)")


# ---- 2. 8-way contention -------------------------------------------------------------------

def contention(work: Path, quick: bool, t: Tally) -> dict:
    calls, target, rounds = (100, 10, 2) if quick else (600, 40, 6)
    # one queue manifest
    url = str(work / "c-queue")
    procs = [Lines(spawn("produce", url, f"w{i}", str(calls))) for i in range(8)]
    for p in procs:
        p.done(t)
    contents = _queue_contents(url)
    seqs = [s for s, _ in contents]
    stored = Counter(e for _, es in contents for e in es)
    want = Counter(f"w{i}:{j}" for i in range(8) for j in range(calls))
    t.bad("acked_lost", sum((want - stored).values()), "8 producers: entries missing")
    t.bad("acked_duplicated", sum((stored - want).values()), "8 producers: entries twice")
    t.bad("committed_damaged", int(seqs != list(range(len(seqs)))), "8 producers: sequence gap")
    # one persist shard
    from headrace.persist import PersistClient

    purl, barrier = str(work / "c-persist"), work / "barrier"
    barrier.mkdir()
    procs = [Lines(spawn("persist", purl, str(i), str(barrier), str(target))) for i in range(8)]
    while len(list(barrier.iterdir())) < 8 and all(p.proc.poll() is None for p in procs):
        time.sleep(0.01)  # a start barrier, not an interleaving
    (barrier / "go").touch()
    wins = Counter()
    winner = {}
    for i, p in enumerate(procs):
        for x in p.done(t):
            if x.startswith("W "):
                wins[int(x.split()[1])] += 1
                winner[int(x.split()[1])] = i
    client = PersistClient(purl)
    snap = client.read_only("race").snapshot(target - 1, timeout_s=0)
    got = Counter(zip(snap.column("at").to_pylist(), snap.column("writer").to_pylist(),
                      snap.column("diff").to_pylist(), strict=True))
    client.close()
    t.bad("acked_duplicated", sum(c - 1 for c in wins.values()), "8 persist writers: an upper "
          "won twice")
    t.bad("acked_lost", target - len(wins), "8 persist writers: uppers without a winner")
    t.bad("committed_damaged", int(got != Counter({(u, w, 1): 3 for u, w in winner.items()})),
          "8 persist writers: shard contents differ from the winning batches")
    # one reservoir stream
    rurl = str(work / "c-reservoir")
    acked: dict[int, set[str]] = {}
    procs = [Lines(spawn("reservoir", rurl, "bundled", f"x{i}", str(rounds))) for i in range(8)]
    fenced = 0
    for p in procs:
        out = p.done(t)
        fenced += sum(1 for x in out if x == "F")
        for x in out:
            if x.startswith("C "):
                acked.setdefault(int(x.split()[1]), set()).add(x.split()[2])
    version = _check_reservoir(rurl, "bundled", acked, t, "8 reservoir writers")
    t.bad("committed_damaged", int(sorted(acked) != list(range(1, version + 1))),
          f"8 reservoir writers: committed versions {sorted(acked)} vs stream at {version}")
    return {"contention_queue_entries": sum(stored.values()), "contention_persist_upper": target,
            "contention_reservoir_commits": sum(len(v) for v in acked.values()),
            "contention_reservoir_fenced": fenced}


# ---- 3./4. sweep and hostile ---------------------------------------------------------------

def hostile_suite(work: Path, t: Tally) -> dict:
    peak = 0.0
    tmp = work / "hostile"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, WORKER, "hostile", str(tmp)], capture_output=True,
                          text=True, env=ENV, timeout=600)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            res = json.loads(line)
            results[res["case"]] = res
    for name in CASES:
        res = results.get(name, {"outcome": f"untyped: no result (rc {proc.returncode}: "
                                            f"{proc.stderr[-300:]})", "growth_mib": 0.0})
        escaped = [str(p) for p in (tmp / name).rglob("escaped*")]
        t.n["hostile_cases"] += 1
        peak = max(peak, res["growth_mib"])
        outcome = res["outcome"]
        t.bad("untyped_errors", int(outcome.startswith("untyped")), f"hostile {name}: {outcome}")
        t.bad("hostile_accepted", int(outcome == "accepted" or bool(escaped)),
              f"hostile {name}: accepted ({outcome}; files outside the target: {escaped})")
    return {"hostile_max_rss_mib": round(peak, 1)}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    q = args.quick
    rng = random.Random(1515)
    t = Tally()
    figures: dict = {}
    t0 = time.perf_counter()
    with scratch_dir("torture") as work:
        for what, fn in [
            ("producer kills", lambda: kill_producers(work, 8 if q else 12, rng, t)),
            ("consumer kills", lambda: kill_consumers(work, 6 if q else 12, rng, t)),
            ("reservoir writer kills", lambda: kill_reservoir_writers(work, 5 if q else 8, rng,
                                                                       t)),
            ("8-way contention", lambda: figures.update(contention(work, q, t))),
            ("corruption sweep", lambda: _sweep(work, q, t)),
            ("hostile inputs", lambda: figures.update(hostile_suite(work, t))),
            ("faulty store", lambda: _faults(work, q, t)),
            ("pipeline kills", lambda: kill_pipeline(work, 1 if q else 6, rng, t)),
        ]:
            s = time.perf_counter()
            fn()
            figures[f"seconds_{what.replace(' ', '_').replace('-', '_')}"] = \
                time.perf_counter() - s
            print(f"{what}: {time.perf_counter() - s:.1f} s; so far {dict(t.n)}", flush=True)
    for key in ("acked_lost", "acked_duplicated", "committed_damaged", "silent_wrong_reads",
                "untyped_errors", "hostile_accepted", "worker_errors", "kills", "mutations", "faults",
                "hostile_cases"):
        figures[key] = t.n[key]
    figures.update({k: v for k, v in t.n.items() if k.startswith(("sweep_", "unchecked_"))})
    figures["seconds"] = time.perf_counter() - t0
    for line in t.failures:
        print("FAIL " + line, file=sys.stderr)
    report("torture", figures, args)


def _sweep(work: Path, quick: bool, t: Tally) -> None:
    (work / "sweep").mkdir()
    r = corruption_sweep(work / "sweep", quick)
    t.n["mutations"] += r.mutations
    t.n["silent_wrong_reads"] += r.silent_wrong_reads
    # wrong reads where RFC 0001's formats have no check (docs/guarantees.md), counted apart
    t.n["unchecked_wrong_reads_rfc_none_batches"] += \
        r.by_type["buffer/batch_none_unchecked:unchecked_wrong_reads"]
    t.n["unchecked_wrong_reads_rfc_manifest_metadata"] += \
        r.by_type["buffer/queue_manifest:unchecked_wrong_reads"]
    t.n["untyped_errors"] += r.untyped_errors
    for k, v in r.by_type.items():
        ftype, outcome = k.split(":")
        if outcome in ("silent_wrong_reads", "untyped_errors"):
            t.n[f"sweep_{ftype.replace('/', '_').replace('-', '_')}_{outcome}"] += v
    t.failures += [f"sweep: {e}" for e in r.examples]


def _faults(work: Path, quick: bool, t: Tally) -> None:
    for fn in (faulty_buffer, faulty_persist):
        res = fn(work, quick)
        t.n["faults"] += res["faults"]
        for key in ("acked_lost", "acked_duplicated", "committed_damaged"):
            t.bad(key, res.get(key, 0), f"{fn.__name__}: {res.get('detail', '')}")


if __name__ == "__main__":
    main()
