"""The settings' Datasets page: the local datasets federated jobs may train on here (their
rows never leave this machine). A thin client of the agent's /datasets (desktop.local_api),
which reads and checks each one before declaring it."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.control import ControlClient, ControlError, NotRunning


class DatasetsPage(QWidget):
    def __init__(self, client: ControlClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        root = QVBoxLayout(self)
        root.setContentsMargins(18, 16, 18, 16)
        hint = QLabel("Federated jobs train on these where they are: only each dataset's "
                      "name, shape, row count and hash are shown to the marketplace.")  # fmt: skip
        hint.setObjectName("muted")
        hint.setWordWrap(True)
        root.addWidget(hint)
        self.list = QListWidget()
        root.addWidget(self.list)
        buttons = QHBoxLayout()
        self.add_file = QPushButton("Add file…")
        self.add_folder = QPushButton("Add image folder…")
        self.remove = QPushButton("Remove")
        for b in (self.add_file, self.add_folder, self.remove):
            buttons.addWidget(b)
        root.addLayout(buttons)
        self.error = QLabel()
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        root.addWidget(self.error)
        self.add_file.clicked.connect(lambda: self._add(folder=False))
        self.add_folder.clicked.connect(lambda: self._add(folder=True))
        self.remove.clicked.connect(self._remove)
        self.refresh()

    def refresh(self) -> None:
        self.list.clear()
        try:
            rows = self.client.datasets()
        except (ControlError, NotRunning) as exc:
            self.error.setText(str(exc))
            return
        for d in rows:
            shape = "x".join(str(n) for n in d.get("input_shape", []))
            self.list.addItem(f"{d['name']} — {d['kind']}, {d['rows']} rows of {shape}, "
                              f"{d['num_classes']} classes — {d['path']}")  # fmt: skip

    def declare(self, name: str, path: str) -> bool:
        """Ask the agent to read and declare it; its refusal is shown here."""
        try:
            self.client.add_dataset(name, path)
        except (ControlError, NotRunning) as exc:
            self.error.setText(str(exc))
            return False
        self.error.setText("")
        self.refresh()
        return True

    def _add(self, folder: bool) -> None:
        if folder:
            path = QFileDialog.getExistingDirectory(self, "Image folder (one subfolder per class)")
        else:
            path, _ = QFileDialog.getOpenFileName(
                self, "Dataset file", "", "Datasets (*.csv *.npz *.parquet *.pq)"
            )
        if not path:
            return
        name, ok = QInputDialog.getText(self, "Dataset name", "The name jobs ask for:")
        if ok and name.strip():
            self.declare(name.strip(), path)

    def _remove(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        try:
            self.client.remove_dataset(item.text().split(" — ")[0])
        except (ControlError, NotRunning) as exc:
            self.error.setText(str(exc))
            return
        self.refresh()
