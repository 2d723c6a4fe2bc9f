"""What the wrappers read off vLLM-Omni's objects: whether a payload or an
output carries content, stage numbers, request IDs, trace headers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .._lifecycle import traceparent_in


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


#: Keys of a multimodal output that hold metadata, even as tensors (a
#: sample rate, the finish flag), as vLLM-Omni's own output code names them.
_METADATA_KEYS = frozenset({"sr", "sample_rate", "audio_sample_rate"})


def _is_metadata_key(key: str) -> bool:
    return key in _METADATA_KEYS or key == "meta" or key.startswith("meta.")


def multimodal_has_content(value: Any) -> bool:
    """Whether a multimodal output carries content: a tensor with
    elements, an image, a non-empty sequence or text, found in a
    ``MultimodalPayload`` (its ``tensors``; its ``metadata`` is not
    content) or a mapping. A number alone, and the values of metadata keys
    (a sample rate, even as a tensor), are not content; numbers in a
    sequence are."""
    if value is None or isinstance(value, (bool, int, float)):
        return False
    tensors = getattr(value, "tensors", None)
    if isinstance(tensors, Mapping):
        # vLLM-Omni's MultimodalPayload (0.30.0 to 0.32.0rc1).
        value = tensors
    if isinstance(value, Mapping):
        return any(
            multimodal_has_content(v) for k, v in value.items() if not (isinstance(k, str) and _is_metadata_key(k))
        )
    if isinstance(value, (list, tuple)):
        return any(_element_has_content(v) for v in value)
    return has_content(value)


def _element_has_content(value: Any) -> bool:
    # Inside a sequence a number is data (a sample), not metadata.
    if isinstance(value, (bool, int, float)):
        return True
    return multimodal_has_content(value)


def output_has_content(output: Any) -> bool:
    """A stage output with content, wherever the release puts it: the
    request output's own ``multimodal_output``, each completion's
    ``multimodal_output`` (where code2wav's audio is, as a
    ``MultimodalPayload``), its token IDs or text, a diffusion stage's
    ``images`` or ``latents``."""
    if multimodal_has_content(getattr(output, "multimodal_output", None)):
        return True
    for completion in getattr(output, "outputs", None) or ():
        if (
            has_content(getattr(completion, "token_ids", None))
            or has_content(getattr(completion, "text", None))
            or multimodal_has_content(getattr(completion, "multimodal_output", None))
        ):
            return True
    return has_content(getattr(output, "images", None)) or has_content(getattr(output, "latents", None))


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


