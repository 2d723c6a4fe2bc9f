"""The edgemark families on a server's own ``/metrics``, written once for both
plugins: the region's histograms per edge and event, its counters and gauges,
exactly as ``edgemark export --listen`` serves them (the core renders them,
``Region.prometheus_text``), added to the ``prometheus_client`` registry the
server's ``/metrics`` serves.

vLLM's API server takes that registry from ``get_prometheus_registry`` when
it mounts ``/metrics``: the global ``REGISTRY``, or with several API servers
(``--api-server-count N``, multiprocess mode) a registry of its own over the
processes' files. The plugin wraps that call (both plugins: vLLM-Omni's API
server is vLLM's) and registers one ``RegionCollector`` in what it returns;
in multiprocess mode the route that answers ``/metrics`` makes a registry
of its own at each scrape, and gets one too (``hook_multiprocess``).
Every API server reads the same region file, so whichever answers a scrape
answers for the whole region: one set of families per region, never one per
process, with no file of their own in the multiprocess directory.

A scrape reads the region then (one sweep of its slots, without the GIL).
What cannot be read gives ``edgemark_region_ok 0``, never an error on the
server's ``/metrics``; a collector that fails for any other reason yields
nothing for that scrape, and says so at most once a minute.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Iterator

#: Where vLLM's API server takes the registry its ``/metrics`` serves (every
#: release both plugins support).
REGISTRY_MODULE = "vllm.entrypoints.serve.instrumentator.metrics"


class RegionCollector:
    """A ``prometheus_client`` collector of the region a plugin's recording
    uses now (``rec.region()``: the API server's own, made again when its
    file is replaced, or the one at the region's path in a process that
    serves ``/metrics`` without making it)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec

    def describe(self) -> list:
        # Nothing up front: the families are the region's, read at each
        # scrape; registering does not read the file.
        return []

    def collect(self) -> Iterator[Any]:
        owner = self.rec.owner
        if owner is not None and owner.released:
            return
        try:
            region = self.rec.region()
            if region is None:
                return
            # vLLM's dependency, imported where vLLM serves its metrics.
            from prometheus_client.parser import text_string_to_metric_families

            text = region.prometheus_text()
            families = list(text_string_to_metric_families(text))
        except Exception as e:  # noqa: BLE001 - a scrape of the server's own metrics must not fail
            self.rec.said.warn("metrics", "edgemark: the region's metrics were left out of /metrics: %r", e)
            return
        self.rec.said.ended("metrics")
        yield from families


#: The registries a collector was added to, by identity.
_added: "weakref.WeakSet[Any]" = weakref.WeakSet()


def wrap_registry(orig: Callable, rec: Any) -> Callable:
    """``get_prometheus_registry`` that also adds the region's collector to
    the registry it returns, once per registry, and in multiprocess mode to
    the registry the ``/metrics`` route makes at each scrape
    (``hook_multiprocess``)."""

    def get_prometheus_registry(*args, **kwargs):
        registry = orig(*args, **kwargs)
        try:
            if registry not in _added:
                registry.register(RegionCollector(rec))
                _added.add(registry)
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR") is not None:
                hook_multiprocess(rec)
        except Exception as e:  # noqa: BLE001 - the server serves its own metrics without ours
            rec.once.warn("metrics-add", "edgemark: the region's metrics are not on this server's /metrics: %r", e)
        return registry

    return get_prometheus_registry


#: The recording whose region the multiprocess route's registries read.
_hooked: Any = None

#: The module whose ``/metrics`` route vLLM's API server uses
#: (``Instrumentator.expose``).
INSTRUMENTATOR_MODULE = "prometheus_fastapi_instrumentator.instrumentation"


def hook_multiprocess(rec: Any) -> None:
    """In multiprocess mode (``--api-server-count N``), the ``/metrics``
    route vLLM mounts (``prometheus_fastapi_instrumentator``'s
    ``Instrumentator.expose``, matched before the registry's own mount)
    ignores the registry it was given: at each scrape it makes a
    ``CollectorRegistry()`` of its own and a ``MultiProcessCollector`` in
    it. The name ``CollectorRegistry`` in that module (where nothing else
    makes one) becomes a subclass that also holds the region's collector.
    Once per process; a module without the name is left alone."""
    import importlib

    global _hooked
    # The recording the route's registries read: this process's latest.
    _hooked = rec
    module = importlib.import_module(INSTRUMENTATOR_MODULE)
    base = getattr(module, "CollectorRegistry", None)
    if not isinstance(base, type) or getattr(base, "_edgemark_region", False):
        return

    base_init: Callable[..., None] = getattr(base, "__init__")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base_init(self, *args, **kwargs)
        now = _hooked
        if now is None:
            return
        try:
            self.register(RegionCollector(now))
        except Exception as e:  # noqa: BLE001 - the scrape goes on without ours
            now.said.warn("metrics", "edgemark: the region's metrics were left out of /metrics: %r", e)

    # A subclass under the same name, made with `type` (it is the module's
    # name for the class, not one of ours).
    hooked = type(base.__name__, (base,), {"_edgemark_region": True, "__init__": __init__})
    hooked.__qualname__ = base.__qualname__
    setattr(module, "CollectorRegistry", hooked)
