"""What the wrappers read off vLLM-Omni's objects: whether a payload or an
output carries content, stage numbers, request IDs, trace headers."""

from __future__ import annotations

from typing import Any, Optional


def has_content(value: Any) -> bool:
    """Whether ``value`` carries anything: a tensor with elements, a
    non-empty sequence, a mapping with a value that has content."""
    if value is None:
        return False
    numel = getattr(value, "numel", None)
    if callable(numel):
        return numel() > 0
    if isinstance(value, dict):
        return any(has_content(v) for v in value.values())
    if isinstance(value, (list, tuple, set, str, bytes)):
        return len(value) > 0
    return True


def chunk_has_content(payload: Any) -> bool:
    """A chunk the adapter moved carries content: a field besides ``meta``
    (where the finish flags travel) with content. An empty terminal marker
    (``{"meta": {"finished": True}}``) has none."""
    if isinstance(payload, dict):
        return any(k != "meta" and has_content(v) for k, v in payload.items())
    if payload is None:
        return False
    fields = getattr(payload, "__struct_fields__", None)
    if fields is not None:
        return any(f != "meta" and has_content(getattr(payload, f, None)) for f in fields)
    return has_content(payload)


def mixin_payload_meaningful(host: Any, payload: Any) -> bool:
    """A payload the consumer can act on, by the model runner mixin's own
    helper: an empty terminal marker or a metadata-only wake-up is not."""
    if isinstance(payload, dict):
        return bool(host._payload_is_consumable(payload))
    return payload is not None


def output_has_content(output: Any) -> bool:
    """A stage output with tokens, text or multimodal content."""
    mm = getattr(output, "multimodal_output", None)
    if isinstance(mm, dict):
        if any(has_content(v) for v in mm.values()):
            return True
    elif has_content(mm):
        return True
    for completion in getattr(output, "outputs", None) or ():
        if has_content(getattr(completion, "token_ids", None)) or has_content(getattr(completion, "text", None)):
            return True
    return False


def stage(value: Any) -> Optional[int]:
    """A stage number, or ``None``."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


def put_key_request(put_key: Any) -> Optional[str]:
    """The external request ID of a connector key
    (``"<external request id>_<stage>_<chunk>"``)."""
    if not isinstance(put_key, str):
        return None
    parts = put_key.rsplit("_", 2)
    return parts[0] if len(parts) == 3 else None


def traceparent_of(request: Any) -> Optional[str]:
    """The ``traceparent`` in a request's ``trace_headers``, or ``None``."""
    return traceparent_in(getattr(request, "trace_headers", None))


def traceparent_in(headers: Any) -> Optional[str]:
    """The ``traceparent`` in a mapping of trace headers (name compared
    without case), or ``None``."""
    if not headers:
        return None
    try:
        value = headers.get("traceparent")
        if value is None:
            for k, v in headers.items():
                if isinstance(k, str) and k.lower() == "traceparent":
                    value = v
                    break
    except AttributeError:
        return None
    return value if isinstance(value, str) else None
