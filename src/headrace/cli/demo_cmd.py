"""`headrace demo`: the end-to-end pipeline on a local folder (or any store), killed and restarted.

1. producers write a deterministic stream of customers and orders (with region moves and
   cancellations) into the ingest queue, all but its tail (see ``held_back``);
2. the pipeline (join + aggregate, state in the reservoir, output in a shard) runs in its own
   process, and is SIGKILLed after a few micro-batches (or once it has drained the queue);
3. the tail is produced while it is down; it is restarted, recovers from the object store alone
   and drains the queue, so it always processes input of its own on top of recovered state;
4. its output shard is checked against a from-scratch PySpark computation over the same events;
5. a summary: rows, micro-batches, object-store requests and their cost, state size, recovery.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from headrace.spark.demo_worker import spawn_worker, worker_events

console = Console()
CHUNK = 250  # events per produce() call


def held_back(events: int) -> int:
    """Events produced only after run 1 is killed: a fifth of the stream, at least one chunk,
    never all of it. Without them a short stream (small --orders) is drained by run 1 before the
    kill, and the restarted pipeline recovers and then has nothing to do."""
    return max(0, min(events - 1, max(CHUNK, events // 5)))


def _produce(root: str, payloads: list[bytes], rate: float, progress, task_id, result: dict,
             offset: int = 0):
    from headrace.buffer import Producer, ProducerConfig
    from headrace.spark.demo import QUEUE

    cfg = ProducerConfig(url=root, data_path_prefix=QUEUE, manifest_path=f"{QUEUE}/manifest",
                         flush_interval_s=0.1)
    t0 = time.perf_counter()
    try:
        with Producer(cfg) as producer:
            handles = []
            for i in range(0, len(payloads), CHUNK):
                handles.append(producer.produce(payloads[i : i + CHUNK]))
                progress.update(task_id, completed=offset + min(i + CHUNK, len(payloads)))
                if rate > 0:
                    due = (i + CHUNK) / rate - (time.perf_counter() - t0)
                    if due > 0:
                        time.sleep(due)
            for h in handles:
                h.watcher.await_durable(timeout=120)
        result["durable"] = result.get("durable", 0) + len(payloads)
    except Exception as e:  # surfaced by the main thread
        result["error"] = e
    result["seconds"] = result.get("seconds", 0.0) + time.perf_counter() - t0


def _sizes(root: str) -> dict[str, tuple[int, int]]:
    from headrace.store import open_store

    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in open_store(root).list(""):
        top = m.key.split("/", 1)[0]
        out[top][0] += 1
        out[top][1] += m.size
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


@click.command("demo")
@click.option("--url", default=None, help="Object store URL (default: ./demo-data, recreated).")
@click.option("--orders", default=20_000, show_default=True, type=click.IntRange(min=1),
              help="Orders in the stream.")
@click.option("--customers", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--rate", default=4000.0, show_default=True, help="Events per second (0: max).")
@click.option("--minutes", default=None, type=float,
              help="Scale the stream to last about this long at --rate.")
@click.option("--partitions", default=4, show_default=True, help="Shuffle partitions (P).")
@click.option("--kill-after", default=3, show_default=True, type=click.IntRange(min=1),
              help="SIGKILL the pipeline after this many micro-batches (or once it is idle).")
@click.option("--batches-per-trigger", default=4, show_default=True,
              help="Queue batches per micro-batch.")
@click.option("--master", default="local[2]", show_default=True,
              help="Spark master, e.g. local-cluster[2,1,1024] for executors in separate JVMs.")
@click.option("--seed", default=7, show_default=True)
def demo(url, orders, customers, rate, minutes, partitions, kill_after, batches_per_trigger,
         master, seed):
    """Run the end-to-end pipeline, kill it, restart it, and check its output."""
    from headrace.spark.demo import DemoSpec, encode, generate_events

    if minutes:
        orders = max(1000, int(minutes * 60 * rate * 0.95))
    if url is None:
        folder = Path("demo-data").resolve()
        shutil.rmtree(folder, ignore_errors=True)
        url = str(folder)
    ckpt = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"headrace-demo-spark-{os.getpid()}")
    spec = DemoSpec(seed=seed, customers=customers, orders=orders)
    payloads = encode(generate_events(spec))
    from headrace.store import open_store

    shown = open_store(url).url  # without query parameters: credentials are never printed
    console.print(f"[bold]headrace demo[/]: {len(payloads):,} events -> queue -> join + "
                  f"aggregate (P={partitions}) -> shard, store {shown}")
    produced: dict = {}
    split = len(payloads) - held_back(len(payloads))
    common = ["--root", url, "--partitions", str(partitions), "--checkpoint-dir", ckpt,
              "--batches-per-trigger", str(batches_per_trigger), "--master", master]
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console) as progress:
        prod = progress.add_task("producers", total=len(payloads), info="")
        run1 = progress.add_task("pipeline (run 1)", total=kill_after, info="")
        thread = threading.Thread(target=_produce, name="headrace-demo-producer",
                                  args=(url, payloads[:split], rate, progress, prod, produced))
        thread.start()
        worker = spawn_worker(common)
        batches1 = 0
        for ev in worker_events(worker, idle_s=15):
            if ev is None:
                if not thread.is_alive() and batches1 >= 1:
                    os.killpg(worker.pid, signal.SIGKILL)  # drained before kill_after
                    break
                continue
            if ev["event"] == "batch":
                batches1 += 1
                progress.update(run1, completed=batches1,
                                info=f"t={ev['time']} seq<={ev['through_sequence']}")
                if batches1 >= kill_after:
                    os.killpg(worker.pid, signal.SIGKILL)
                    break
        rc1 = worker.wait()
        thread.join()
        if rc1 != -signal.SIGKILL:  # it ended by itself: no kill happened, nothing to recover
            shutil.rmtree(ckpt, ignore_errors=True)
            raise click.ClickException(
                f"pipeline run 1 exited by itself (exit {rc1}) after {batches1} micro-batches, "
                "before it could be killed; to see why, run it alone: "
                f"python -m headrace.spark.demo_worker --root {shown} --until-idle")
        progress.update(run1, description=f"pipeline (run 1) [red]SIGKILLed[/] after "
                        f"{batches1} batches")
        if "error" not in produced:  # the tail: input only the restarted pipeline will see
            _produce(url, payloads[split:], rate, progress, prod, produced, offset=split)
        if "error" in produced:
            raise click.ClickException(f"producers failed: {produced['error']}")
        run2 = progress.add_task("pipeline (run 2)", total=None, info="recovering")
        t_restart = time.perf_counter()
        worker = spawn_worker([*common, "--until-idle", "--verify-seed", str(seed),
                         "--customers", str(customers), "--orders", str(orders)])
        recovered = done = verified = None
        for ev in worker_events(worker):
            if ev["event"] == "recovered":
                recovered = dict(ev, wall_s=time.perf_counter() - t_restart)
                progress.update(run2, info=f"recovered at t={ev['time']}")
            elif ev["event"] == "batch":
                progress.update(run2, info=f"t={ev['time']} seq<={ev['through_sequence']}")
            elif ev["event"] == "done":
                done = ev
            elif ev["event"] == "verified":
                verified = ev
        rc = worker.wait()
    shutil.rmtree(ckpt, ignore_errors=True)
    if rc != 0 or done is None:
        raise click.ClickException(f"pipeline run 2 failed (exit {rc})")
    _summary(url, payloads, produced, batches1, recovered, done, verified,
             len(payloads) - split)
    if not verified or not verified["ok"]:
        raise click.ClickException("output does not match the batch recomputation")
    if done["batches"] == 0:
        raise click.ClickException("the restarted pipeline processed no micro-batch: the "
                                   "kill/recover step was not exercised")


def _summary(url, payloads, produced, batches1, recovered, done, verified, tail) -> None:
    from headrace.store import PriceTable

    t = Table(title="headrace demo summary", show_header=False)
    t.add_row("events produced (durable)", f"{produced.get('durable', 0):,} in "
              f"{produced.get('seconds', 0):.1f} s")
    t.add_row("micro-batches", f"{batches1} before the kill + {done['batches']} after restart "
              f"(pipeline time {done['time']})")
    t.add_row("produced while the pipeline was down", f"{tail:,} events")
    t.add_row("recovery", f"{recovered['wall_s']:.1f} s to recovered state at t="
              f"{recovered['time']} (Spark start-up {recovered['startup_s']:.1f} s, headrace "
              f"recover {recovered['recover_s']:.2f} s, outputs replayed: "
              f"{recovered['replayed']})")
    dr, tr = done["driver_requests"], done["task_requests"]
    p = PriceTable()
    task_cost = (tr.get("puts", 0) * p.put_per_1000 + tr.get("gets", 0) * p.get_per_1000
                 + tr.get("lists", 0) * p.list_per_1000 + tr.get("heads", 0)
                 * p.head_per_1000) / 1000
    t.add_row("requests, run 2 (driver)", ", ".join(f"{k} {dr[k]:,}" for k in
                                                    ("puts", "gets", "lists", "heads", "deletes")))
    t.add_row("requests, run 2 (tasks)", ", ".join(f"{k} {tr.get(k, 0):,}" for k in
                                                   ("puts", "gets", "lists", "heads")))
    per_batch = (dr["puts"] + tr.get("puts", 0)) / max(1, done["batches"])
    t.add_row("PUTs per micro-batch (all)", f"{per_batch:.1f}")
    t.add_row("cost of run 2 at S3 prices", f"${done['driver_cost_usd'] + task_cost:.5f}")
    for top, (n, size) in _sizes(url).items():
        t.add_row(f"stored under {top}/", f"{n:,} objects, {size / 1e6:.2f} MB")
    if verified:
        t.add_row("output vs PySpark batch recomputation",
                  ("[green]identical[/]" if verified["ok"] else "[red]DIFFERENT[/]")
                  + f" ({verified['rows']} rows)")
    console.print(t)


commands = [demo]
