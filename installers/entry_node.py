"""PyInstaller entry point for gpuflex-node (the console agent).

On Linux the bundle has one executable: gpuflex-tray is a symlink to gpuflex-node (each
executable carries the whole 200 MB Python archive), so the name it was started by picks the
program. Windows and macOS build gpuflex-tray as its own windowed executable (entry_tray.py).
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    if Path(sys.argv[0]).name.startswith("gpuflex-tray"):
        from desktop.gui.app import main
    else:
        from desktop.cli import main
    sys.exit(main())
