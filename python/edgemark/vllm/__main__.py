"""``python -m edgemark.vllm clean``: removes the regions (and their
request lookups) that no running server holds (``edgemark._clean``; the
same command as ``python -m edgemark.vllm_omni clean``)."""

import sys

from .._clean import main

if __name__ == "__main__":
    sys.exit(main("python -m edgemark.vllm", sys.argv[1:]))
