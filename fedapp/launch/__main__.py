"""``python -m fedapp.launch``: the launcher's command line (see :mod:`fedapp.launch`)."""

import sys

from fedapp.launch import main

if __name__ == "__main__":
    sys.exit(main())
