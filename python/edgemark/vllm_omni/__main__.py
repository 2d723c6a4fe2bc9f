"""``python -m edgemark.vllm_omni clean``: removes the regions (and their
request lookups) that API servers killed with SIGKILL left behind."""

import sys

from ._clean import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
