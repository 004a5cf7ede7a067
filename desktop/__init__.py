"""The contributor app: GPU detection, benchmark, the headless agent and the tray GUI."""
