"""PyInstaller entry point for gpuflex-tray (the windowed tray app)."""

import sys

from desktop.gui.app import main

if __name__ == "__main__":
    sys.exit(main())
