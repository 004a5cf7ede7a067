"""PyInstaller entry point for gpuflex-node (the console agent)."""

import sys

from desktop.cli import main

if __name__ == "__main__":
    sys.exit(main())
