"""Test set-up: the tests run against the installed package, and every test
file belongs to one subject, by the start of its name.

Started as ``python -m pytest`` from the ``python/`` folder, the current
folder (the package's sources, without the built extension) would come first
on ``sys.path`` and shadow the installed package.

The subjects (``SUBJECTS``; README.md in this folder says what each needs
and where CI runs it) are pytest markers too: ``pytest python/tests -m
vllm_pd`` runs one. A test file whose name starts with no subject's prefix
stops the collection: a new file says what it is about.
"""

import os
import sys

import pytest

_SOURCES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _SOURCES]

#: Subject marker -> (file name prefix, what it tests). Longest prefix first:
#: ``test_vllm_omni`` and ``test_vllm_pd`` are two subjects.
SUBJECTS = {
    "core": ("test_core_", "the bindings and the command: regions, records, reports, traces, processes"),
    "stream_edge": ("test_stream_edge", "the drop-in for vLLM-Omni's stream-edge module, upstream's cases"),
    "otel": ("test_otel", "the OpenTelemetry helpers"),
    "plugins": ("test_plugins_", "what both plugins share: the lifecycle, the instrumentor's checks"),
    "vllm_omni": ("test_vllm_omni", "the vLLM-Omni plugin"),
    "vllm_pd": ("test_vllm_pd", "the vLLM P/D plugin"),
}


def subject_of(filename: str):
    """The subject of a test file, by the start of its name, or ``None``."""
    matches = [(len(prefix), name) for name, (prefix, _) in SUBJECTS.items() if filename.startswith(prefix)]
    return max(matches)[1] if matches else None


def pytest_configure(config):
    for name, (prefix, what) in SUBJECTS.items():
        config.addinivalue_line("markers", f"{name}: {what} (files {prefix}*)")


def pytest_collection_modifyitems(config, items):
    stray = set()
    for item in items:
        filename = os.path.basename(str(item.fspath))
        subject = subject_of(filename)
        if subject is None:
            stray.add(filename)
        else:
            item.add_marker(getattr(pytest.mark, subject))
    if stray:
        raise pytest.UsageError(
            f"test files with no subject: {', '.join(sorted(stray))}; name each after one of "
            + ", ".join(p for p, _ in SUBJECTS.values())
            + " (python/tests/conftest.py)"
        )


@pytest.fixture
def region_env(tmp_path, monkeypatch):
    """The vLLM P/D tests' one region, which both instances are given, as on
    one host (``EDGEMARK_VLLM_REGION``)."""
    from edgemark import vllm as em_vllm

    path = str(tmp_path / "pd.region")
    monkeypatch.setenv(em_vllm.ENV_REGION, path)
    monkeypatch.delenv("_EDGEMARK_VLLM_NAMED", raising=False)
    return path
