"""The engine core and the model worker: the KV connectors, and the
scheduler's per-step output.

One patch point reaches every connector in both processes:
``KVConnectorFactory.create_connector`` (the scheduler calls it, and the
worker through ``kv_transfer_state``). Its wrapper patches the hooks of each
connector instance it returns (instance attributes: the class is never
changed), once each hook has been checked by name and parameters; a
connector without them, or one that does not speak NIXL's vocabulary (the
decode side gets the prefill side's request ID as ``remote_request_id``:
Mooncake keys by ``transfer_id``, LMCache and offloading connectors hand
nothing between instances), is left alone, with one warning. So is a connector
made of others (``MultiConnector``, which has ``sub_connectors``): it
aggregates its children's answers, so its own hooks do not say which child
handed a request over or read it, and its children are made without the
factory. Such a pair runs unrecorded (docs/limitations.md).

==========================================  ==============================================
call site (on each connector instance)      records
==========================================  ==============================================
scheduler side: ``request_finished`` and    ``producer_first_nonempty_emit`` when a prefill
``request_finished_all_groups``             request's blocks are kept for a decode side
                                            (``(True, params)``); a prefill request not
                                            handed over closes; a finished decode request
                                            closes (see ``_recording``)
scheduler side: ``on_new_request`` (where   a decode request is registered as it arrives,
the release has it) and ``update_state_     its token looked up through
after_alloc``                               ``remote_request_id`` (again at allocation
                                            while none was found)
scheduler side: ``update_connector_         ``consumer_first_accept`` for each decode
output``                                    request in ``finished_recving`` and not in
                                            ``failed_recving``: the step's aggregate,
                                            once every worker rank has loaded it, so
                                            the same moment whatever the TP size and
                                            wherever the workers run
worker side: ``get_transfer_results``       ``edge_first_send_complete`` for each
                                            ``finished_sending`` ID the lease reaper did
                                            not add and no notification reported: a push
                                            whose WRITE completed (0.33 on)
NIXL's worker: ``_get_new_notifs``          ``edge_first_send_complete`` for each request a
                                            decode side said it has read (pull mode)
NIXL's worker: ``_reap_expired_send_        each request it reaps: its lease expired
leases``                                    before a decode side read it; it closes,
                                            the later events null
==========================================  ==============================================

=======================================  ===================================================
call site (class)                        records
=======================================  ===================================================
``Scheduler.update_from_output``         ``consumer_first_nonempty_output``: the first
                                         step whose sampled tokens (``req_ids``,
                                         ``sampled_token_ids``) for a registered decode
                                         request are not empty. While no decode request
                                         waits for its first token (every request already
                                         recorded) the wrapper only tests one dict and
                                         calls through.
=======================================  ===================================================

What each wrapper reads is checked before anything is patched
(``package.PARTS``): a part that does not check out in the installed release
is left unwrapped (its events not recorded), with one warning.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, Set, Tuple

from .._instrument import Target
from ._recording import SCHEDULER_PART, SENDER_PART, Recording, follows, log

_FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"

#: The scheduler side's hooks and the parameters each wrapper relies on.
SCHEDULER_HOOKS: Dict[str, Tuple[str, ...]] = {
    "update_state_after_alloc": ("request", "blocks", "num_external_tokens"),
    "update_connector_output": ("connector_output",),
}
#: Wrapped where the connector has them.
OPTIONAL_HOOKS: Dict[str, Tuple[str, ...]] = {
    "on_new_request": ("request",),
}
#: The hook whose wrapper reads a part (``package.PARTS``): unwrapped when
#: that part is refused.
HOOK_PARTS = {"update_connector_output": "accept"}
#: At least one of these (``request_finished_all_groups`` for connectors
#: that support the hybrid allocator, NIXL among them).
FINISH_HOOKS: Dict[str, Tuple[str, ...]] = {
    "request_finished": ("request", "block_ids"),
    "request_finished_all_groups": ("request", "block_ids"),
}
WORKER_HOOKS: Dict[str, Tuple[str, ...]] = {
    "get_transfer_results": ("finished_req_ids",),
}

def _params(method: Any) -> Optional[Tuple[str, ...]]:
    try:
        return tuple(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return None


def check_hooks(connector: Any, role: str) -> Tuple[Dict[str, Any], str]:
    """The hooks of ``connector`` the plugin wraps for ``role``
    (``"SCHEDULER"`` or ``"WORKER"``), as bound methods by name; or ``{}``
    and why not."""
    if role == "SCHEDULER":
        wanted, either = SCHEDULER_HOOKS, FINISH_HOOKS
    elif role == "WORKER":
        wanted, either = WORKER_HOOKS, {}
    else:
        return {}, f"role {role} is neither the scheduler's nor the worker's"
    optional = OPTIONAL_HOOKS if role == "SCHEDULER" else {}
    found: Dict[str, Any] = {}
    for name, params in {**wanted, **either, **optional}.items():
        method = getattr(connector, name, None)
        if method is None:
            if name in wanted:
                return {}, f"it has no {name}"
            continue
        got = _params(method)
        if not callable(method) or got is None or got[: len(params)] != params:
            if name in optional:
                # Only an earlier chance at what a required hook also does.
                continue
            return {}, f"its {name} takes {got}, expected {params}"
        found[name] = method
    if either and not any(n in found for n in either):
        return {}, f"it has neither {' nor '.join(either)}"
    return found, ""


def _nixl_worker(connector: Any) -> Tuple[Optional[Any], str]:
    """NIXL's worker, with the two methods the send side is recorded from:
    ``_get_new_notifs`` (the IDs a decode side finished reading, in pull
    mode) and ``_reap_expired_send_leases`` (which adds the IDs whose lease
    expired to ``get_transfer_results``' ``finished_sending``); or ``None``
    and why not."""
    worker = getattr(connector, "connector_worker", None)
    if worker is None:
        return None, "it has no connector_worker"
    notifs = getattr(worker, "_get_new_notifs", None)
    if notifs is None or not callable(notifs) or _params(notifs) != ():
        return None, "its worker's _get_new_notifs is missing or takes parameters"
    reap = getattr(worker, "_reap_expired_send_leases", None)
    got = _params(reap) if callable(reap) else None
    if got is None or got[:1] != ("done_sending",):
        return None, f"its worker's _reap_expired_send_leases takes {got}, expected ('done_sending',)"
    return worker, ""


def wrap_instance(connector: Any, role: str, rec: Recording) -> bool:
    """Patches ``connector``'s hooks for ``role``; ``False`` (and one
    warning per connector class) when it lacks them."""
    hooks: Dict[str, Any]
    if getattr(type(connector), "sub_connectors", None) is not None:
        hooks, why = {}, "it is made of other connectors (sub_connectors), which edgemark does not record yet"
    elif not follows(c.__name__ for c in type(connector).__mro__):
        # Same hooks, another vocabulary: the decode side would never be
        # joined, and every finished ID would cost a lookup read.
        hooks, why = {}, "it does not hand the decode side the prefill side's request ID (remote_request_id)"
    else:
        hooks, why = check_hooks(connector, role)
    if not hooks:
        rec.once.warn(
            f"connector-{type(connector).__qualname__}-{role}",
            "edgemark: the KV connector %s (%s side) is not one edgemark follows (%s): none of the P/D hand-off's "
            "four events is recorded for it; only NixlConnector is",
            type(connector).__name__,
            role.lower(),
            why,
        )
        return False
    for name, method in hooks.items():
        if HOOK_PARTS.get(name) in rec.broken:
            continue
        make = _SCHEDULER_WRAPPERS.get(name) or _WORKER_WRAPPERS[name]
        wrapper = make(method, rec, connector)
        if wrapper is not method:
            setattr(connector, name, functools.wraps(method)(wrapper))
    if role == "SCHEDULER":
        # This instance's API server begins requests on this host only while
        # a scheduler side of it records here.
        rec.announce(SCHEDULER_PART)
    log.debug("edgemark: wrapped the %s side of KV connector %s", role.lower(), type(connector).__name__)
    return True


# -- scheduler side -------------------------------------------------------------


def _finished(method: Callable, rec: Recording, connector: Any) -> Callable:
    def request_finished(request, block_ids, *args, **kwargs):
        result = method(request, block_ids, *args, **kwargs)
        try:
            delay_free, params = result
            rec.handed_over(request, delay_free, params)
        except Exception as e:  # noqa: BLE001 - recording never fails a request
            rec.once.debug("w-finished", "edgemark: a finished request not recorded: %r", e)
        return result

    return request_finished


def _new_request(method: Callable, rec: Recording, connector: Any) -> Callable:
    def on_new_request(request, *args, **kwargs):
        try:
            rec.pd_of(request)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-new", "edgemark: a decode request not registered: %r", e)
        return method(request, *args, **kwargs)

    return on_new_request


def _after_alloc(method: Callable, rec: Recording, connector: Any) -> Callable:
    def update_state_after_alloc(request, blocks, num_external_tokens, *args, **kwargs):
        try:
            # Before the connector's own update, which may clear
            # ``do_remote_prefill`` (NIXL does).
            rec.pd_of(request)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-alloc", "edgemark: a decode request not registered: %r", e)
        return method(request, blocks, num_external_tokens, *args, **kwargs)

    return update_state_after_alloc


def _accepted(rec: Recording, finished_recving: Any, failed: Any) -> None:
    for rid in finished_recving:
        if not failed or rid not in failed:
            rec.accepted(rid)


def _connector_output(method: Callable, rec: Recording, connector: Any) -> Callable:
    def update_connector_output(connector_output, *args, **kwargs):
        try:
            recving = connector_output.finished_recving
            if recving:
                _accepted(rec, recving, connector_output.failed_recving)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-output", "edgemark: consumer accept not recorded: %r", e)
        return method(connector_output, *args, **kwargs)

    return update_connector_output


_SCHEDULER_WRAPPERS = {
    "request_finished": _finished,
    "request_finished_all_groups": _finished,
    "on_new_request": _new_request,
    "update_state_after_alloc": _after_alloc,
    "update_connector_output": _connector_output,
}


# -- worker side ----------------------------------------------------------------


def _send_side(rec: Recording, connector: Any) -> Optional[Tuple[Set[str], Set[str], Any]]:
    """Wraps NIXL's worker methods the send side is recorded from (on the
    instance), and returns the sets they fill each step: the IDs notified
    read (send complete, recorded as they arrive) and the IDs reaped (lease
    expired, closed as they are reaped); ``None`` (said once) when the
    worker lacks them."""
    worker, why = _nixl_worker(connector)
    if worker is None:
        rec.once.warn(
            f"send-side-{type(connector).__qualname__}",
            "edgemark: the KV connector %s does not say which sends completed and which leases expired (%s): "
            "edge_first_send_complete is not recorded for it, and its requests close by the bound on open requests",
            type(connector).__name__,
            why,
        )
        return None
    notified: Set[str] = set()
    reaped: Set[str] = set()
    get_new_notifs = worker._get_new_notifs
    reap = worker._reap_expired_send_leases

    @functools.wraps(get_new_notifs)
    def _get_new_notifs(*args, **kwargs):
        ids = get_new_notifs(*args, **kwargs)
        try:
            # All of them first: an ID missing here would be taken for a
            # push that completed.
            notified.update(ids)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-notif", "edgemark: send complete not recorded: %r", e)
            return ids
        for rid in ids:
            try:
                rec.sent(rid)
            except Exception as e:  # noqa: BLE001
                rec.once.debug("w-notif", "edgemark: send complete not recorded: %r", e)
        return ids

    @functools.wraps(reap)
    def _reap_expired_send_leases(done_sending, *args, **kwargs):
        before = None
        try:
            before = set(done_sending)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-reap", "edgemark: an expired lease not recorded: %r", e)
        out = reap(done_sending, *args, **kwargs)
        if before is not None:
            try:
                added = set(done_sending) - before
                reaped.update(added)
                for rid in added:
                    rec.expired(rid)
            except Exception as e:  # noqa: BLE001
                rec.once.debug("w-reap", "edgemark: an expired lease not recorded: %r", e)
        return out

    worker._get_new_notifs = _get_new_notifs
    worker._reap_expired_send_leases = _reap_expired_send_leases
    return notified, reaped, worker


def _transfer_results(method: Callable, rec: Recording, connector: Any) -> Callable:
    """The worker's step results: send complete for each push whose WRITE
    completed. A rank's own ``finished_recving`` is not read: with TP > 1
    each rank loads its shard, and the request is accepted when the
    scheduler's ``update_connector_output`` sees all of them done (recorded
    there, the same moment in every deployment)."""
    send = None if "send" in rec.broken else _send_side(rec, connector)
    if send is None:
        return method
    notified, reaped, nixl_worker = send
    # A prefill request this instance's API server saw finish waits for
    # send complete (or the lease) only while a send side records here.
    rec.announce(SENDER_PART)

    def get_transfer_results(finished_req_ids, *args, **kwargs):
        notified.clear()
        reaped.clear()
        try:
            # A replicated prefill-context-parallel rank reports what it
            # never sent as finished at once: not a send complete.
            unsent = set(getattr(nixl_worker, "_replicated_pcp_done_sending", ()))
        except Exception:  # noqa: BLE001
            unsent = set()
        results = method(finished_req_ids, *args, **kwargs)
        try:
            sending = results.finished_sending
            if sending:
                for rid in sending:
                    if rid not in notified and rid not in reaped and rid not in unsent:
                        # Neither read nor reaped: a push whose WRITE
                        # completed (the push worker adds those).
                        rec.sent(rid)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-results", "edgemark: transfer results not recorded: %r", e)
        return results

    return get_transfer_results


_WORKER_WRAPPERS = {"get_transfer_results": _transfer_results}


# -- the factory and the scheduler's step ---------------------------------------


def wrap_create_connector(orig: Callable, rec: Recording) -> Callable:
    def create_connector(cls, config, role, kv_cache_config, *args, **kwargs):
        connector = orig(cls, config, role, kv_cache_config, *args, **kwargs)
        try:
            wrap_instance(connector, getattr(role, "name", str(role)), rec)
        except Exception as e:  # noqa: BLE001 - a plugin must not stop vLLM
            rec.once.warn("w-factory", "edgemark: a KV connector was not wrapped: %r", e)
        return connector

    return create_connector


def wrap_update_from_output(orig: Callable, rec: Recording) -> Callable:
    waiting = rec.awaiting_output

    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        if not waiting:
            return orig(self, scheduler_output, model_runner_output, *args, **kwargs)
        out = orig(self, scheduler_output, model_runner_output, *args, **kwargs)
        try:
            rec.first_output(model_runner_output)
        except Exception as e:  # noqa: BLE001
            rec.once.debug("w-first", "edgemark: consumer output not recorded: %r", e)
        return out

    return update_from_output


TARGETS = (
    Target(_FACTORY, "KVConnectorFactory", "create_connector", ("cls", "config", "role", "kv_cache_config"),
           wrap_create_connector),
)  # fmt: skip

ENGINE_TARGETS = (
    Target("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output",
           ("self", "scheduler_output", "model_runner_output"), wrap_update_from_output, part="output"),
)  # fmt: skip
