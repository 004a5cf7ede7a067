"""The contributor app: GPU detection, benchmark, the headless agent and the tray GUI."""

from importlib import metadata

try:
    __version__ = metadata.version("gpuflex")
except metadata.PackageNotFoundError:  # running from a bundle or a bare checkout
    __version__ = "0.1.0"
