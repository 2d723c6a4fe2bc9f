"""The cost of recording one first event from Python, beside the alternatives,
measured in one process in one run.

    pip install ./python && python python/bench.py [--write docs/python-benchmarks.md]

Rows (nanoseconds per call; each figure is the median, over --repeats runs
that each measure every row once, of a timed loop's time divided by its
calls, so it includes the loop's own overhead, which the "empty loop" row
shows):

* edgemark ``Region.record``: the stage process's call, into a region file
  under the default directory; every call wins a fresh cell (one per request,
  edge and event), as a real first event does. Variants: the clock-reading
  form (the normal one), a value measured elsewhere (``elapsed_ms=``), the
  event by name, a duplicate (refused), a disabled region.
* edgemark ``Handle.record``: ``region.handle(token, from, to, event)``
  resolved once beforehand (untimed), then ``record()`` with no argument,
  and ``record_elapsed(ms, domain)``.
* The drop-in ``edgemark.stream_edge``: ``StreamEdgeRecorder.record`` in
  the call shape of upstream's callers (``elapsed_ms=``, ``clock_domain=``,
  ``meaningful=``) and reading the shared clock; every call wins a fresh
  cell.
* The upstream stream-edge module's design, written again in pure Python:
  a frozen-dataclass handle of its owner and key, the owner's dict of edge
  segments to first events (frozen-dataclass observations), guarded by a
  ``threading.Lock``, in the same call shape. In process only.
* A minimal locked dict: the per-request state of the orchestrator, a dict
  guarded by a ``threading.Lock``, first write wins, in process.
* Sending the observation to the owner process over a
  ``multiprocessing.Queue``: the caller's ``put``, and the whole trip until
  the owner process has applied every observation to its recorder.
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

# Run as `python python/bench.py`, the script's own folder (the package's
# sources, without the built extension) would shadow the installed package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import edgemark  # noqa: E402
from edgemark import Event, Region  # noqa: E402
from edgemark.stream_edge import (  # noqa: E402
    RequestStreamEdgeEvents,
    StreamEdgeEvent,
    StreamEdgeKey,
)

EDGES = [(0, 1), (1, 2)]
CELLS = [(f, t, e) for (f, t) in EDGES for e in Event]


# ---------------------------------------------------------------------------
# The upstream-style recorder.


class LockedRecorder:
    """The upstream design: per-request state owned in process by the
    orchestrator, a dict guarded by a lock, the first write of an event for a
    request, edge and segment wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict = {}

    def begin(self, request_id) -> None:
        with self._lock:
            self._requests[request_id] = {
                "origin_ns": time.monotonic_ns(),
                "segments": {},
                "edges": {},
            }

    def record(
        self,
        request_id,
        from_stage: int,
        to_stage: int,
        event: Event,
        meaningful: bool = True,
        chunk_seq=None,
        segment: int = 0,
        elapsed_ms=None,
    ) -> bool:
        if not meaningful:
            return False
        if not isinstance(event, Event):
            raise ValueError(f"not an event: {event!r}")
        with self._lock:
            state = self._requests.get(request_id)
            if state is None:
                return False
            edge = (from_stage, to_stage)
            if state["segments"].get(edge, 0) != segment:
                return False
            if elapsed_ms is None:
                elapsed_ms = (time.monotonic_ns() - state["origin_ns"]) / 1e6
            elif not math.isfinite(elapsed_ms) or elapsed_ms < 0:
                return False
            key = (from_stage, to_stage, segment)
            cells = state["edges"].get(key)
            if cells is None:
                cells = state["edges"][key] = {}
            if event in cells:
                return False
            cells[event] = elapsed_ms
            if chunk_seq is not None and event is Event.PRODUCER_FIRST_NONEMPTY_EMIT:
                cells["first_chunk_seq"] = chunk_seq
            return True

    def close(self, request_id):
        with self._lock:
            return self._requests.pop(request_id, None)


# ---------------------------------------------------------------------------
# The upstream module's design, for the drop-in's comparison.


@dataclass(frozen=True)
class _Observation:
    elapsed_ms: float
    clock_domain: str


@dataclass
class _FirstEvents:
    observations: dict = field(default_factory=dict)
    first_chunk_seq: object = None


class UpstreamStyleEvents:
    """The upstream stream-edge module's design, written again here for the
    comparison: one object per request owned by the orchestrator, a dict of
    edge segments to first events, the current segment of each edge, and a
    ``threading.Lock`` so that the connector threads of the owner's process
    may record. In process only: no other process can reach it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: dict = {}
        self.segments: dict = {}
        self.closed = False

    def start_segment(self, key: StreamEdgeKey) -> "UpstreamStyleRecorder":
        with self.lock:
            edge = (key.from_stage, key.to_stage)
            current = self.segments.get(edge)
            if current is not None and key.segment_index < current.segment_index:
                raise ValueError("retired segment")
            self.segments[edge] = key
        return UpstreamStyleRecorder(self, key)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.events.clear()
            self.segments.clear()


@dataclass(frozen=True)
class UpstreamStyleRecorder:
    """The upstream handle: a frozen dataclass of its owner and key."""

    owner: UpstreamStyleEvents
    key: StreamEdgeKey

    def record(self, event, *, elapsed_ms, clock_domain, meaningful, chunk_seq=None) -> bool:
        owner = self.owner
        key = self.key
        if not meaningful or owner.closed or owner.segments.get((key.from_stage, key.to_stage)) != key:
            return False
        if not isinstance(event, StreamEdgeEvent):
            raise ValueError("unknown event")
        if not math.isfinite(elapsed_ms) or elapsed_ms < 0:
            raise ValueError("elapsed time must be finite and non-negative")
        if not clock_domain or not clock_domain.strip():
            raise ValueError("clock domain must be declared")
        if chunk_seq is not None and chunk_seq < 0:
            raise ValueError("chunk sequence must be non-negative")
        with owner.lock:
            state = owner.events.get(key)
            if state is None:
                state = owner.events[key] = _FirstEvents()
            if event in state.observations:
                return False
            state.observations[event] = _Observation(float(elapsed_ms), clock_domain)
            if event is StreamEdgeEvent.PRODUCER_EMIT:
                state.first_chunk_seq = chunk_seq
            return True


# ---------------------------------------------------------------------------
# The owner process of the queue alternative.


def owner_process(inbox, acks) -> None:
    """Applies every observation it receives to its own recorder; after each
    batch of ``n`` it acknowledges."""
    rec = LockedRecorder()
    while True:
        msg = inbox.get()
        if msg is None:
            return
        if msg[0] == "begin":
            for rid in msg[1]:
                rec.begin(rid)
            acks.put("begun")
            continue
        if msg[0] == "expect":
            n, done = msg[1], 0
            while done < n:
                rid, f, t, e, chunk, ms = inbox.get()
                rec.record(rid, f, t, Event(e), chunk_seq=chunk, elapsed_ms=ms)
                done += 1
            for rid in msg[2]:
                rec.close(rid)
            acks.put(done)


# ---------------------------------------------------------------------------
# Timing.


def timed(fn) -> int:
    """Runs ``fn`` with the collector off; its time in nanoseconds."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        fn()
        return time.perf_counter_ns() - t0
    finally:
        gc.enable()


class Result:
    def __init__(self, name: str, per_call: list, note: str = "") -> None:
        self.name = name
        self.per_call = per_call
        self.note = note

    @property
    def median(self) -> float:
        return statistics.median(self.per_call)

    @property
    def best(self) -> float:
        return min(self.per_call)


def edgemark_once(region: Region, n: int, rows: dict) -> None:
    """One run of the edgemark rows: for each recording variant, ``n`` fresh
    requests with every cell recorded once (each call wins a fresh cell)."""
    P = Event.PRODUCER_FIRST_NONEMPTY_EMIT
    # Untimed: bring the slots back into the caches after the other rows.
    tokens = [region.begin() for _ in range(n)]
    for tok in tokens:
        region.record(tok, 0, 1, P)
        region.close(tok)
    for variant in ("record", "record_elapsed", "record_by_name", "record_outcome", "handle", "handle_elapsed"):
        tokens = [region.begin() for _ in range(n)]
        assert None not in tokens, "the region is too small for --n"
        total = 0
        for f, t, e in CELLS:
            if variant == "record":

                def loop(rec=region.record, f=f, t=t, e=e):
                    for tok in tokens:
                        rec(tok, f, t, e)

            elif variant == "record_elapsed":

                def loop(rec=region.record, f=f, t=t, e=e):
                    for tok in tokens:
                        rec(tok, f, t, e, elapsed_ms=1.5, clock_domain="host_monotonic")

            elif variant == "record_by_name":

                def loop(rec=region.record, f=f, t=t, name=str(e)):
                    for tok in tokens:
                        rec(tok, f, t, name)

            elif variant == "record_outcome":

                def loop(rec=region.record_outcome, f=f, t=t, e=e):
                    for tok in tokens:
                        rec(tok, f, t, e)

            else:
                # Resolved beforehand (untimed), as a caller keeps a handle.
                handles = [region.handle(tok, f, t, e) for tok in tokens]
                if variant == "handle":

                    def loop(handles=handles):
                        for h in handles:
                            h.record()

                else:

                    def loop(handles=handles):
                        for h in handles:
                            h.record_elapsed(1.5, "host_monotonic")

            total += timed(loop)
        # Every call above won its cell.
        s = region.close(tokens[-1])
        assert all(s[k][e.key] is not None for k in ("0->1:0", "1->2:0") for e in Event), s
        for tok in tokens[:-1]:
            region.close(tok)
        rows[variant].append(total / (n * len(CELLS)))

    tok = region.begin()
    region.record(tok, 0, 1, P)
    same = [tok] * n

    def dup(rec=region.record):
        for t in same:
            rec(t, 0, 1, P)

    rows["duplicate"].append(timed(dup) / n)
    region.close(tok)

    nones = [None] * n

    def disabled(rec=Region.disabled().record):
        for t in nones:
            rec(t, 0, 1, P)

    rows["disabled"].append(timed(disabled) / n)

    def empty():
        for t in same:
            pass

    rows["empty_loop"].append(timed(empty) / n)

    def native(now=edgemark.monotonic_ns):
        for t in same:
            now()

    rows["native_call"].append(timed(native) / n)


KEYS = [StreamEdgeKey(f, t) for (f, t) in EDGES]
#: The clock domain of the values "measured elsewhere" in the call shape of
#: upstream's callers.
DOMAIN = "sender"


def stream_edge_once(region: Region, n: int, rows: dict) -> None:
    """One run of the drop-in: ``n`` fresh requests of
    ``edgemark.stream_edge``, every cell recorded once through the handles,
    in upstream's call shape (``elapsed_ms=``, ``clock_domain=``) and
    reading the shared clock."""
    for variant in ("se_upstream_shape", "se_shared_clock"):
        requests = [RequestStreamEdgeEvents(region=region) for _ in range(n)]
        assert all(ev.token is not None for ev in requests), "the region is too small for --n"
        total = 0
        for key in KEYS:
            handles = [ev.start_segment(key) for ev in requests]
            for e in StreamEdgeEvent:
                if variant == "se_upstream_shape":

                    def loop(handles=handles, e=e, d=DOMAIN):
                        for h in handles:
                            h.record(e, elapsed_ms=1.5, clock_domain=d, meaningful=True)

                else:

                    def loop(handles=handles, e=e):
                        for h in handles:
                            h.record(e, meaningful=True)

                total += timed(loop)
        final = requests[-1].close()
        assert all(final[k][e.value + "_ms"] is not None for k in ("0->1:0", "1->2:0") for e in StreamEdgeEvent), final
        for ev in requests[:-1]:
            ev.close()
        rows[variant].append(total / (n * len(CELLS)))


def upstream_once(n: int, rows: dict) -> None:
    """One run of the upstream design: ``n`` fresh requests, every cell
    recorded once through its handles, in the same call shape."""
    requests = [UpstreamStyleEvents() for _ in range(n)]
    total = 0
    for key in KEYS:
        handles = [ev.start_segment(key) for ev in requests]
        for e in StreamEdgeEvent:

            def loop(handles=handles, e=e, d=DOMAIN):
                for h in handles:
                    h.record(e, elapsed_ms=1.5, clock_domain=d, meaningful=True)

            total += timed(loop)
    assert all(len(s.observations) == 4 for s in requests[-1].events.values())
    for ev in requests:
        ev.close()
    rows["upstream_design"].append(total / (n * len(CELLS)))


def locked_once(rec: LockedRecorder, run: int, n: int, rows: dict) -> None:
    """One run of the upstream-style recorder: ``n`` fresh requests, every
    cell recorded once."""
    ids = [f"req-{run}-{i}" for i in range(n)]
    for rid in ids:
        rec.begin(rid)
    total = 0
    for f, t, e in CELLS:

        def loop(f=f, t=t, e=e, record=rec.record):
            for rid in ids:
                record(rid, f, t, e)

        total += timed(loop)
    for rid in ids:
        rec.close(rid)
    rows["locked"].append(total / (n * len(CELLS)))


def queue_once(inbox, acks, run: int, n: int, rows: dict) -> None:
    """One run of the queue: every cell of ``n`` requests sent to the owner
    process; the caller's time to put them all, and the time until the owner
    has applied them all."""
    ids = [f"req-{run}-{i}" for i in range(n)]
    inbox.put(("begin", ids))
    assert acks.get(timeout=120) == "begun"
    calls = n * len(CELLS)
    inbox.put(("expect", calls, ids))

    def send(put=inbox.put):
        for f, t, e in CELLS:
            for rid in ids:
                put((rid, f, t, int(e), None, None))

    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        send()
        t1 = time.perf_counter_ns()
        assert acks.get(timeout=300) == calls
        t2 = time.perf_counter_ns()
    finally:
        gc.enable()
    rows["queue_put"].append((t1 - t0) / calls)
    rows["queue_applied"].append((t2 - t0) / calls)


class PrometheusMetrics:
    """prometheus_client's Counter and Histogram in multiprocess mode, with
    the labels a per-edge metric would have. ``PROMETHEUS_MULTIPROC_DIR``
    must be set before prometheus_client is first imported: its value class
    is chosen at import."""

    def __init__(self, directory: str) -> None:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        import prometheus_client
        from prometheus_client import values

        if "MultiProcess" not in repr(values.ValueClass) and "Mmaped" not in values.ValueClass.__name__:
            raise RuntimeError(
                "prometheus_client is not in multiprocess mode (was it imported before PROMETHEUS_MULTIPROC_DIR was set?)"
            )
        registry = prometheus_client.CollectorRegistry()
        names = ("from_stage", "to_stage", "event")
        self.counter = prometheus_client.Counter(
            "edgemark_bench_first_events", "first events", names, registry=registry
        )
        self.histogram = prometheus_client.Histogram(
            "edgemark_bench_first_event_ms", "first event elapsed ms", names, registry=registry
        )
        self.labels = [(str(f), str(t), str(e)) for f, t, e in CELLS]
        self.directory = directory

    def total(self) -> float:
        """The counter's total over the files of every process, as a scrape
        reads it (untimed)."""
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.directory)
        return sum(
            s.value
            for m in registry.collect()
            if m.name == "edgemark_bench_first_events"
            for s in m.samples
            if s.name.endswith("_total")
        )


def prometheus_once(prom: PrometheusMetrics, n: int, rows: dict) -> None:
    """One run of prometheus_client: ``n`` calls per labelled cell for each
    of its four forms."""
    for variant in ("prom_counter_labels", "prom_counter_child", "prom_hist_labels", "prom_hist_child"):
        total = 0
        for lv in prom.labels:
            if variant == "prom_counter_labels":

                def loop(m=prom.counter, lv=lv, r=range(n)):
                    for _ in r:
                        m.labels(*lv).inc()

            elif variant == "prom_counter_child":

                def loop(c=prom.counter.labels(*lv), r=range(n)):
                    for _ in r:
                        c.inc()

            elif variant == "prom_hist_labels":

                def loop(m=prom.histogram, lv=lv, r=range(n)):
                    for _ in r:
                        m.labels(*lv).observe(1.5)

            else:

                def loop(c=prom.histogram.labels(*lv), r=range(n)):
                    for _ in r:
                        c.observe(1.5)

            total += timed(loop)
        rows[variant].append(total / (n * len(CELLS)))


def run_all(region: Region, n: int, queue_n: int, repeats: int, prom=None) -> dict:
    """Every row once per run, the runs interleaved, so that a burst of
    other load on the machine spreads over all rows instead of one."""
    rows: dict = {
        k: []
        for k in (
            "record",
            "record_elapsed",
            "record_by_name",
            "record_outcome",
            "handle",
            "handle_elapsed",
            "duplicate",
            "disabled",
            "empty_loop",
            "native_call",
            "locked",
            "se_upstream_shape",
            "se_shared_clock",
            "upstream_design",
            "queue_put",
            "queue_applied",
            "prom_counter_labels",
            "prom_counter_child",
            "prom_hist_labels",
            "prom_hist_child",
        )
    }
    ctx = multiprocessing.get_context("spawn")
    inbox, acks = ctx.Queue(), ctx.Queue()
    owner = ctx.Process(target=owner_process, args=(inbox, acks), daemon=True)
    owner.start()
    locked = LockedRecorder()
    try:
        # A first run warms everything up (the owner process, the caches).
        warm: dict = {k: [] for k in rows}
        edgemark_once(region, n, warm)
        stream_edge_once(region, n, warm)
        upstream_once(n, warm)
        locked_once(locked, -1, n, warm)
        queue_once(inbox, acks, -1, queue_n, warm)
        if prom is not None:
            prometheus_once(prom, n, warm)
        for run in range(repeats):
            edgemark_once(region, n, rows)
            stream_edge_once(region, n, rows)
            upstream_once(n, rows)
            locked_once(locked, run, n, rows)
            queue_once(inbox, acks, run, queue_n, rows)
            if prom is not None:
                prometheus_once(prom, n, rows)
    finally:
        inbox.put(None)
        owner.join(30)
        if owner.is_alive():
            owner.kill()
    return rows


# ---------------------------------------------------------------------------
# Report.


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def table(results, base: float, upstream: float) -> str:
    lines = [
        "| what | ns per call (median) | best run | vs edgemark `record` | vs upstream design |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.median:,.0f} | {r.best:,.0f} | {r.median / base:.2f}x"
            f" | {r.median / upstream:.2f}x |"
        )
    return "\n".join(lines)


DOC = """# Python benchmarks

What one `record` costs a stage process that calls edgemark from Python,
beside what a user would otherwise write: an in-process recorder in the
upstream style (a dict guarded by a `threading.Lock`, first write wins) and
sending each observation to the owner process over a
`multiprocessing.Queue`. All rows come from one run of one process
(`python/bench.py`); the queue's owner is a second process it starts.

{table}

Each figure is the median over {repeats} runs of a timed loop's time divided
by its calls ({calls:,} calls per run for the recorders, {qcalls:,} for the
queue), with Python's collector off; "best run" is the fastest of those runs.
Each run measures every row once, after one warm-up run, so that other load
on the machine falls on all rows alike.
Every figure includes the Python `for` loop around the call (the "empty
loop" row) and the call itself: a native call that reads the clock and does
nothing else costs what the "native call floor" row shows, so most of a
`record` from Python is the interpreter's call and its argument conversion,
and the record itself (one clock read and one compare-and-swap) is the rest.
Keyword arguments (`elapsed_ms=`, `clock_domain=`) cost more to convert than
positional ones. The machine is shared with other work: figures move by a
fifth or so between runs, while the ratios within one run hold.

- **edgemark `record`** writes into a region file under the default
  directory; every call wins a fresh cell (one per request, edge and event),
  as a first event does, and reads the shared clock itself.
  `elapsed_ms=` records a value measured elsewhere instead; "by name" passes
  the event as its string; a duplicate is refused; a disabled region returns
  at once.
- **edgemark `Handle.record()`** records through a handle that
  `region.handle(token, from_stage, to_stage, event)` resolved beforehand
  (untimed, as a caller keeps one per request and edge): no argument to
  convert. `record_elapsed(ms, domain)` records a value measured elsewhere.
- **Drop-in `StreamEdgeRecorder.record`** is `edgemark.stream_edge`'s
  handle, resolved to its request, edge and segment when it was made, so a
  record is one native call: in upstream's call shape (a value measured
  elsewhere, in a named clock domain) and reading the shared clock itself.
  In this run it took {dropin_ratio:.2f} of the upstream design's time (the
  target is at most 0.50).
- **Upstream design** is the upstream module's recorder as its pull request
  wrote it (a frozen-dataclass handle, per-request dicts, a frozen-dataclass
  observation per event), with a `threading.Lock` so that the connector
  threads of one process could share it; like the **minimal locked dict**
  (a dict guarded by a lock, nothing else), it is only possible where the
  observer and the owner share a process, which three of the four events do
  not.
- **`multiprocessing.Queue`** is what crossing to the owner process costs in
  pure Python: the caller's `put` (pickling happens on the queue's feeder
  thread, which competes for the caller's GIL), and the whole trip until the
  owner process has applied every observation.
- **prometheus_client, multiprocess mode** (what vLLM uses across its
  processes): a `Counter` and a `Histogram` labelled by from stage, to stage
  and event, each written through `.labels(...)` at every call and on a
  child resolved beforehand. Each write takes the metric's lock and updates
  this process's own memory-mapped file (one file per metric type and pid);
  a histogram also finds its bucket and writes the sum and the bucket. It
  counts and sums: it keeps no first value per request, and a scrape reads
  and merges every pid's files. The script checks that the counter's total
  over the files is every `inc` it made.

Machine (`lscpu | grep 'Model name'`): {machine}, {cores} cores; Python
{python}; edgemark {version} built in release mode by `pip install ./python`.

Reproduce:

```sh
python3 -m venv .venv && .venv/bin/pip install ./python
.venv/bin/python python/bench.py --write docs/python-benchmarks.md
```
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15, help="runs per row (default 15)")
    ap.add_argument("--n", type=int, default=4096, help="requests per run (default 4096)")
    ap.add_argument("--queue-n", type=int, default=1024, help="requests per queue run (default 1024)")
    ap.add_argument("--write", metavar="PATH", help="also write the report as Markdown to PATH")
    ap.add_argument(
        "--no-prometheus", action="store_true", help="skip the prometheus_client rows (it need not be installed)"
    )
    args = ap.parse_args()

    d = tempfile.mkdtemp(prefix="edgemark-bench-", dir=edgemark.default_dir())
    path = os.path.join(d, "bench.region")
    prom_dir = tempfile.mkdtemp(prefix="edgemark-bench-prom-")
    try:
        prom = None if args.no_prometheus else PrometheusMetrics(prom_dir)
        region = Region.create(path, edges=EDGES, slots=args.n + 1, domains=[DOMAIN])
        rows = run_all(region, args.n, args.queue_n, args.repeats, prom)
        if prom is not None:
            # Every inc of every run, the warm-up's too, is in the files.
            expect = (args.repeats + 1) * 2 * args.n * len(CELLS)
            got = prom.total()
            assert got == expect, f"prometheus_client counted {got}, expected {expect}"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.rmdir(d)
        shutil.rmtree(prom_dir, ignore_errors=True)

    results = [
        Result("edgemark `record` (reads the shared clock)", rows["record"]),
        Result("edgemark `record`, `elapsed_ms=` measured elsewhere", rows["record_elapsed"]),
        Result("edgemark `record`, event by name", rows["record_by_name"]),
        Result("edgemark `record_outcome` (returns the outcome's name)", rows["record_outcome"]),
        Result("edgemark `Handle.record()` (resolved by `region.handle`)", rows["handle"]),
        Result("edgemark `Handle.record_elapsed(ms, domain)`", rows["handle_elapsed"]),
        Result("edgemark `record`, duplicate (refused)", rows["duplicate"]),
        Result("edgemark `record`, disabled region", rows["disabled"]),
        Result(
            "drop-in `StreamEdgeRecorder.record`, upstream's call shape (`elapsed_ms=`, `clock_domain=`)",
            rows["se_upstream_shape"],
        ),
        Result("drop-in `StreamEdgeRecorder.record`, shared clock (no `elapsed_ms`)", rows["se_shared_clock"]),
        Result(
            "upstream design: frozen-dataclass handle, dict + `threading.Lock`, in process",
            rows["upstream_design"],
        ),
        Result("minimal locked dict: first write wins, in process", rows["locked"]),
        Result("`multiprocessing.Queue` to the owner process: caller's `put`", rows["queue_put"]),
        Result("`multiprocessing.Queue` to the owner process: until applied", rows["queue_applied"]),
    ]
    if not args.no_prometheus:
        results += [
            Result("prometheus_client multiprocess `Counter.labels(...).inc()`", rows["prom_counter_labels"]),
            Result("prometheus_client multiprocess `Counter` child `.inc()`", rows["prom_counter_child"]),
            Result(
                "prometheus_client multiprocess `Histogram.labels(...).observe(v)`", rows["prom_hist_labels"]
            ),
            Result("prometheus_client multiprocess `Histogram` child `.observe(v)`", rows["prom_hist_child"]),
        ]
    results += [
        Result("empty loop (for reference)", rows["empty_loop"]),
        Result("native call floor: `edgemark.monotonic_ns()` (for reference)", rows["native_call"]),
    ]
    base = results[0].median
    upstream = statistics.median(rows["upstream_design"])
    dropin = statistics.median(rows["se_upstream_shape"])
    text = table(results, base, upstream)
    print(text)
    print()
    print(f"drop-in record / upstream design record: {dropin / upstream:.2f} (target at most 0.50)")
    floor = statistics.median(rows["native_call"])
    print(f"record / native call floor: {base / floor:.2f}; Handle.record / native call floor: "
          f"{statistics.median(rows['handle']) / floor:.2f} (target for record: at most 1.30)")
    info = dict(
        machine=machine(),
        cores=os.cpu_count(),
        python=platform.python_version(),
        version=edgemark.__version__,
    )
    print()
    print("Machine: {machine}, {cores} cores; Python {python}; edgemark {version}.".format(**info))
    if args.write:
        with open(args.write, "w") as f:
            f.write(
                DOC.format(
                    table=text,
                    repeats=args.repeats,
                    calls=args.n * len(CELLS),
                    qcalls=args.queue_n * len(CELLS),
                    dropin_ratio=dropin / upstream,
                    **info,
                )
            )
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
