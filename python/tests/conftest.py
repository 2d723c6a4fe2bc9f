"""Test set-up: the tests run against the installed package.

Started as ``python -m pytest`` from the ``python/`` folder, the current
folder (the package's sources, without the built extension) would come first
on ``sys.path`` and shadow the installed package.
"""

import os
import sys

_SOURCES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _SOURCES]
