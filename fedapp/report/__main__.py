"""``python -m fedapp.report``: the same command line as ``fedapp-report``."""

from fedapp.report.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
