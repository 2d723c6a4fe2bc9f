"""The build backend of ``pip wheel ./python``: maturin's, with the wheel's
platform tag from ``[tool.maturin] compatibility`` in pyproject.toml.

maturin's PEP 517 hooks pass ``--compatibility off`` unless the build
is given one, and that flag outranks pyproject.toml, so the wheel a user
builds with pip would be tagged bare ``linux_x86_64``, which no index takes
and auditwheel refuses. This passes pyproject.toml's tag instead (maturin
then checks the module's glibc symbol versions against it and refuses the
build if one is newer). A tag given to the build (``--config-settings
maturin.build-args=...`` or ``MATURIN_PEP517_ARGS``) still wins. Every
other hook is maturin's own.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

import maturin
from maturin import (  # noqa: F401  (the hooks pip calls)
    build_editable,
    build_sdist,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # maturin requires tomli below 3.11
    import tomli as tomllib


def _compatibility() -> Optional[str]:
    with open(os.path.join(os.getcwd(), "pyproject.toml"), "rb") as f:
        tag = tomllib.load(f).get("tool", {}).get("maturin", {}).get("compatibility")
    return tag if isinstance(tag, str) else None


def _tagged(config_settings: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    args = list(maturin.get_maturin_pep517_args(config_settings))
    tag = _compatibility()
    given = any(
        a in ("--compatibility", "--manylinux") or a.startswith(("--compatibility=", "--manylinux="))
        for a in args
    )
    if tag is None or given:
        return config_settings
    settings = {k: v for k, v in (config_settings or {}).items() if k != "build-args"}
    settings["maturin.build-args"] = [*args, "--compatibility", tag]
    return settings


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    return maturin.build_wheel(wheel_directory, _tagged(config_settings), metadata_directory)
