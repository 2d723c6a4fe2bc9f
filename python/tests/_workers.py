"""Stage worker processes of the tests: what test_core_multiprocess.py's
workers run, and ``Worker``/``Workers``, a process per stage that a test
drives over a pipe (``_pipeline.py``'s and ``_se.py``'s). A module of its
own so that the spawn start method can import the targets by name."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, Callable, List

from edgemark import Event, Region, Token, monotonic_ns

#: What each stage observes, per request: (from, to, event).
STAGE_MARKS = {
    0: [(0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT), (0, 1, Event.EDGE_FIRST_SEND_COMPLETE)],
    1: [
        (0, 1, Event.CONSUMER_FIRST_ACCEPT),
        (0, 1, Event.CONSUMER_FIRST_NONEMPTY_OUTPUT),
        (1, 2, Event.PRODUCER_FIRST_NONEMPTY_EMIT),
        (1, 2, Event.EDGE_FIRST_SEND_COMPLETE),
    ],
    2: [(1, 2, Event.CONSUMER_FIRST_ACCEPT), (1, 2, Event.CONSUMER_FIRST_NONEMPTY_OUTPUT)],
}


def expected_ms(request: int, from_stage: int, event: Event) -> float:
    """The value the workers record for one cell: distinct per request, edge
    and event, a whole number of microseconds."""
    return request + from_stage * 0.25 + int(event) * 0.001 + 0.5


def record_stage(path: str, stage: int, tokens, go, passes: int, results) -> None:
    """Attaches by path and records every observation of ``stage`` for every
    request, ``passes`` times over (every pass after the first is all
    duplicates), with a heartbeat before each; reports what it won."""
    region = Region.attach(path)
    go.wait(30)
    recorded = 0
    outcomes: dict = {}
    for _ in range(passes):
        for i, token in enumerate(tokens):
            for from_stage, to_stage, event in STAGE_MARKS[stage]:
                # A heartbeat first: it must leave no state.
                region.record(token, from_stage, to_stage, event, meaningful=False)
                o = region.record_outcome(
                    token,
                    from_stage,
                    to_stage,
                    event,
                    chunk_seq=i if event == Event.PRODUCER_FIRST_NONEMPTY_EMIT else None,
                    elapsed_ms=expected_ms(i, from_stage, event),
                )
                outcomes[o] = outcomes.get(o, 0) + 1
                recorded += o == "recorded"
    results.put((stage, os.getpid(), recorded, outcomes))


def record_on_shared_clock(path: str, token_text: str, results) -> None:
    """Records one event on the shared clock and reports the clock readings
    around the call."""
    region = Region.attach(path)
    token = Token.parse(token_text)
    before = monotonic_ns()
    ok = region.record(token, 0, 1, Event.CONSUMER_FIRST_ACCEPT)
    after = monotonic_ns()
    results.put((ok, before, after))


def record_late(path: str, token: Token, results) -> None:
    """Records with a token the orchestrator already closed."""
    region = Region.attach(path)
    results.put(region.record_outcome(token, 0, 1, Event.EDGE_FIRST_SEND_COMPLETE, elapsed_ms=1.0))


def begin_and_exit(path: str, n: int, results) -> None:
    """Begins ``n`` requests and exits without closing them, as a process
    that dies would."""
    region = Region.attach(path)
    tokens = [region.begin() for _ in range(n)]
    for t in tokens:
        region.record(t, 0, 1, Event.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=1.0)
    results.put([str(t) for t in tokens])
    time.sleep(0.05)


def record_with_inherited_region(region: Region, token: Token, results) -> None:
    """A forked child: records through the handle it inherited."""
    results.put(
        region.record_outcome(token, 1, 2, Event.PRODUCER_FIRST_NONEMPTY_EMIT, elapsed_ms=3.0)
    )


# ---------------------------------------------------------------------------
# A process per stage, driven over a pipe.

CTX = multiprocessing.get_context("spawn")

#: The exceptions a worker's answer raises again by name; any other is a
#: RuntimeError.
RAISED = {"ValueError": ValueError, "TypeError": TypeError}


def serve(conn, handle: Callable[[tuple], Any]) -> None:
    """A worker's loop: answers each message (a tuple) with ``("ok",
    handle(msg))``, or ``("raise", name, text)`` for the exception it
    raised; ``("quit",)`` is answered with ``("ok", pid)`` and ends it."""
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            conn.send(("ok", os.getpid()))
            return
        try:
            conn.send(("ok", handle(msg)))
        except Exception as e:  # noqa: BLE001 - sent back to the test
            conn.send(("raise", type(e).__name__, str(e)))


class Worker:
    """One process started with the spawn method, running ``target(conn)``
    (a module-level function that calls ``serve``)."""

    def __init__(self, target: Callable) -> None:
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=target, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def ask(self, *msg):
        """Sends ``msg``; the worker's answer, or the exception it raised."""
        self.conn.send(msg)
        if not self.conn.poll(60):
            raise TimeoutError(f"worker {self.proc.pid} did not answer {msg[0]!r}")
        answer = self.conn.recv()
        if answer[0] == "raise":
            _, name, text = answer
            raise RAISED.get(name, RuntimeError)(text)
        return answer[1]

    def stop(self) -> None:
        try:
            self.ask("quit")
        except (OSError, EOFError, TimeoutError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Workers:
    """One worker process per stage, each running ``target``."""

    def __init__(self, target: Callable, stages=(0, 1, 2)) -> None:
        self.by_stage = {s: Worker(target) for s in stages}

    def __getitem__(self, stage: int) -> Worker:
        return self.by_stage[stage]

    def pids(self) -> List[int]:
        return [w.proc.pid for w in self.by_stage.values()]

    def stop(self) -> None:
        for w in self.by_stage.values():
            w.stop()
