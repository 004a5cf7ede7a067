"""The tray app (PySide6): a thin client of desktop.agent.Agent; the only place Qt is used."""
