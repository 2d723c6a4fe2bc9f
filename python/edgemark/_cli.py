"""The ``edgemark`` command, as the wheel installs it: the console script
``edgemark`` and ``python -m edgemark`` both run :func:`main`, which runs
the command compiled into the native module (the ``edgemark-cli`` crate),
so the wheel needs no separate binary and no Rust toolchain.

It behaves as the binary built with ``cargo install --path cli``: the
same output, the same exit statuses (0, 1 on an error, 2 for a command line
it refuses), Ctrl-C (SIGINT) ends a command as it ends the binary (``export``
catches it, sends what it holds and ends with status 0; ``top`` reads it as
a key), and a closed pipe (``edgemark inspect P | head -1``) ends it quietly
with status 0, SIGPIPE being ignored by Python as by Rust's binaries.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn, Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    """Runs ``edgemark`` with ``argv`` (default: this process's arguments)
    and exits with its status."""
    from ._edgemark import _cli_main

    args = list(sys.argv[1:] if argv is None else argv)
    # Python's handler only sets a flag that nothing reads while the command
    # runs: Ctrl-C must end the command, as it ends the binary. (A SIGINT
    # ignored by whoever started the command, Python leaves ignored, as the
    # binary would be.)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The demo starts its stage workers as this command again.
    again = [sys.executable, "-m", "edgemark"]
    sys.stdout.flush()
    sys.exit(_cli_main(["edgemark", *args], again))
