"""``python -m edgemark``: the ``edgemark`` command (``edgemark._cli``)."""

from ._cli import main

if __name__ == "__main__":
    main()
