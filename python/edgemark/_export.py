"""The server's own export: the closed requests of a plugin's region sent as
OpenTelemetry spans from inside the server, by the exporter ``edgemark
export --otlp`` runs (``Exporter``, on a native thread that never takes the
GIL), with nothing beside the server.

- **When.** An API server of a plugin exports when an OTLP endpoint is
  configured the standard way (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``/v1/traces`` appended, and the rest
  of the ``OTEL_EXPORTER_OTLP_*`` variables, ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``), or by vLLM's ``--otlp-traces-endpoint``
  (which vLLM itself puts in ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).
  ``OTEL_TRACES_EXPORTER`` without ``otlp`` in its list (``none``) turns it
  off. The exporter speaks OTLP over HTTP with protobuf only: vLLM's
  endpoint is used when vLLM sends over HTTP too
  (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``); with vLLM's
  default, gRPC, the URL names a gRPC port, and that is said instead.
- **Who.** Exactly one process exports a region, whatever the number of
  processes that hold it (``--api-server-count N``, two server starts that
  share a named region): the one holding an open file description lock for
  writing on byte ``ELECTION`` of the region file, far past its end, beside
  ``_presence``'s bytes. Every API server tries to take it at start and at
  each tick of its thread (``TICK_S``); the kernel drops it when its holder
  dies, so another takes over within a tick and adopts what the dead one had
  taken and not sent (the core's ``edgemark::follow``). Two exporters at once
  (a region file replaced at its path, a host's ``edgemark export --dir``
  beside) are harmless: each closed request reaches one reader.
- **At exit** (a SIGTERM included: vLLM's server exits through its own
  shutdown), before the region is let go: the exporter stops taking, sends
  what it holds for at most ``FLUSH_DEADLINE_S``, and what is left is said.
  A region whose closed requests are not all sent is never removed by its
  last server: it stays for the next exporter of it, and ``edgemark clean``
  keeps it while its exporter's registration stands (``--force`` removes it
  and counts what it held).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from typing import Mapping, Optional, Tuple

from . import _presence
from ._edgemark import FLUSH_DEADLINE_S, Exporter, Region
from ._said import Said

#: The byte of the region file whose write lock elects its exporter: just
#: below ``_presence``'s bytes, so never one of theirs.
ELECTION = _presence.BASE - 1

TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"


def configured(env: Mapping[str, str], vllm_endpoint: Optional[str]) -> Tuple[bool, Optional[str]]:
    """Whether the server exports, and if not, why (``None``: nothing asked
    for it, nothing to say). ``vllm_endpoint`` is vLLM's
    ``--otlp-traces-endpoint`` (``None`` when not given)."""
    exporters = env.get(TRACES_EXPORTER, "").strip()
    if exporters and "otlp" not in [e.strip() for e in exporters.split(",")]:
        return False, None
    user = env.get(TRACES_ENDPOINT, "").strip() or env.get(ENDPOINT, "").strip()
    if vllm_endpoint and env.get(TRACES_ENDPOINT, "").strip() in ("", vllm_endpoint.strip()):
        # vLLM's endpoint is the one the exporter would use.
        protocol = env.get(TRACES_PROTOCOL, "").strip() or "grpc"
        if protocol != "http/protobuf":
            return False, (
                f"vLLM sends its spans to --otlp-traces-endpoint {vllm_endpoint} over {protocol}, and edgemark "
                f"speaks OTLP over HTTP only: set {TRACES_PROTOCOL}=http/protobuf with the collector's HTTP "
                f"traces URL (for example http://HOST:4318/v1/traces) for both, or {ENDPOINT}=http://HOST:4318 "
                f"for edgemark alone; the region's closed requests are not exported from this server"
            )
        return True, None
    return bool(user), None


class Export:
    """One API server's part in exporting its region: the election, and the
    exporter while this process holds it."""

    def __init__(self, path: str, log: logging.Logger, said: Said) -> None:
        self.path = path
        self.log = log
        self.said = said
        self.exporter: Optional[Exporter] = None
        self._fd: Optional[int] = None
        self._identity: Optional[Tuple[int, int]] = None
        #: A configuration that cannot be used: tried no more.
        self.refused: Optional[str] = None
        #: The counts the exporter stopped with (``stop``).
        self.stopped: Optional[dict] = None
        #: ``tick`` (the tick thread's) and ``stop`` (at exit) one at a time.
        self._lock = threading.Lock()

    # -- the election ------------------------------------------------------------

    def _elected(self) -> bool:
        """Whether this process holds the election of the file now at the
        path (taken now if it is free)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return self._fd is not None  # gone: the exporter drains what it mapped
        if self._fd is not None and self._identity == (st.st_dev, st.st_ino):
            return True
        self._drop_lock()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fst = os.fstat(fd)
            _presence._lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, ELECTION)
        except OSError:
            os.close(fd)  # another process exports it
            return False
        self._fd, self._identity = fd, (fst.st_dev, fst.st_ino)
        return True

    def _drop_lock(self) -> None:
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            os.close(fd)

    # -- the periodic duty -------------------------------------------------------

    def tick(self) -> None:
        """Takes the election if it is free and starts the exporter; lets it
        go when another process exports the file now at the path."""
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        if self.refused is not None:
            self._say_refused()
            return
        if self.stopped is not None or not _presence.supported():
            return
        elected = self._elected()
        exporter = self.exporter
        if exporter is not None:
            if not elected:
                # The file at the path was replaced and another process
                # exports the new one.
                self._stop_exporter()
            elif not exporter.running():
                self.said.warn("export-ended", "edgemark: the exporter of %s ended by itself; starting it again", self.path)
                self.exporter = None
            else:
                return
        if not elected:
            return
        try:
            self.exporter = Exporter.start(self.path)
        except ValueError as e:
            self.refused = str(e)
            self._drop_lock()
            self._say_refused()
            return
        except OSError as e:
            self._drop_lock()
            self.said.warn("export-start", "edgemark: cannot export the closed requests of %s: %s", self.path, e)
            return
        self.said.ended("export-start")
        self.log.info(
            "edgemark: this process (pid %d) sends the closed requests of %s as spans to %s",
            os.getpid(),
            self.path,
            self.exporter.url,
        )

    def _say_refused(self) -> None:
        # Said when found and again at most once a minute while the server
        # runs: the settings cannot change under it.
        self.said.warn(
            "export-refused",
            "edgemark: the OTLP settings cannot be used, the closed requests of %s are not exported: %s",
            self.path,
            self.refused,
        )

    def _stop_exporter(self) -> dict:
        exporter, self.exporter = self.exporter, None
        counts = exporter.stop() if exporter is not None else {}
        return counts

    # -- at exit ------------------------------------------------------------------

    def stop(self, region: Optional[Region]) -> int:
        """Stops the exporter (its flush bounded by ``FLUSH_DEADLINE_S``) and
        lets the election go; the closed requests of ``region`` that no
        exporter has sent, said when there are any."""
        with self._lock:
            if self.stopped is not None:
                return 0
            ran = self.exporter is not None
            self.stopped = self._stop_exporter()
            self._drop_lock()
        unsent = unsent_in(region)
        if ran:
            self.log.info(
                "edgemark: the exporter of %s stopped: %d closed request(s) taken, %d span(s) sent, %d request(s) "
                "left for the next exporter (flush of at most %gs)",
                self.path,
                self.stopped.get("requests", 0),
                self.stopped.get("exported", 0),
                self.stopped.get("left_unsent", 0),
                FLUSH_DEADLINE_S,
            )
        return unsent


def unsent_in(region: Optional[Region]) -> int:
    """The closed requests in ``region``'s ring that no exporter has sent
    (not taken, or taken and not acknowledged); 0 when it cannot be read."""
    if region is None:
        return 0
    try:
        report = region.report()
        if report is None:
            return 0
        return int(report["closed_unread"]) + int(report["closed_unacknowledged"])
    except Exception:  # noqa: BLE001 - at exit: nothing more to learn
        return 0
