"""The first run's "When may GPUFlex work?" page: only when idle (the default) or always, and
the optional schedule, temperature limit and GPU use cap. It only fills in Settings; the
agent applies them (desktop.policy)."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QTime
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QRadioButton,
    QSpinBox,
    QTimeEdit,
    QVBoxLayout,
    QWizardPage,
)

from desktop.config import Settings

DEFAULT_IDLE_MINUTES = 5


class PolicyFields:
    """The schedule, temperature and GPU use fields, the same on this page and in the
    settings dialog's "When to work" tab."""

    def __init__(self, settings: Settings) -> None:
        self.use_schedule = QCheckBox("Only between")
        self.use_schedule.setChecked(bool(settings.schedule_start and settings.schedule_end))
        self.start_time = QTimeEdit(QTime.fromString(settings.schedule_start or "22:00", "HH:mm"))
        self.end_time = QTimeEdit(QTime.fromString(settings.schedule_end or "07:00", "HH:mm"))
        for w in (self.start_time, self.end_time):
            w.setDisplayFormat("HH:mm")
        self.temp = QSpinBox()
        self.temp.setRange(50, 100)
        self.temp.setSuffix(" °C")
        self.temp.setValue(int(settings.max_gpu_temp_c))
        self.busy = QSpinBox()
        self.busy.setRange(5, 100)
        self.busy.setSuffix(" % of the time")
        self.busy.setValue(settings.max_gpu_busy_pct)

    def add_schedule(self, form: QFormLayout) -> None:
        form.addRow(self.use_schedule, self.start_time)
        form.addRow("and", self.end_time)

    def applied(self, settings: Settings) -> Settings:
        schedule = self.use_schedule.isChecked()
        return replace(
            settings,
            schedule_start=self.start_time.time().toString("HH:mm") if schedule else "",
            schedule_end=self.end_time.time().toString("HH:mm") if schedule else "",
            max_gpu_temp_c=float(self.temp.value()),
            max_gpu_busy_pct=self.busy.value(),
        )


class WorkPolicyPage(QWizardPage):
    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.setTitle("When may GPUFlex work?")
        self.setSubTitle(
            "A game or any other program that uses the GPU always pauses GPUFlex within two "
            "seconds; the task is saved and goes on when the program ends."
        )
        lay = QVBoxLayout(self)
        self.idle_only = QRadioButton("Only when I am not using this computer (recommended)")
        self.always = QRadioButton("Always, even while I use it")
        group = QButtonGroup(self)
        group.addButton(self.idle_only)
        group.addButton(self.always)
        row = QHBoxLayout()
        row.addSpacing(24)
        row.addWidget(QLabel("after"))
        self.idle = QSpinBox()
        self.idle.setRange(1, 240)
        self.idle.setSuffix(" min without keyboard or mouse")
        self.idle.setValue(int(settings.idle_minutes) or DEFAULT_IDLE_MINUTES)
        row.addWidget(self.idle)
        row.addStretch(1)
        (self.idle_only if settings.idle_minutes > 0 else self.always).setChecked(True)
        self.idle_only.toggled.connect(self.idle.setEnabled)
        self.idle.setEnabled(self.idle_only.isChecked())
        lay.addWidget(self.idle_only)
        lay.addLayout(row)
        lay.addWidget(self.always)

        form = QFormLayout()
        self.fields = fields = PolicyFields(settings)
        self.use_schedule, self.busy = fields.use_schedule, fields.busy
        fields.add_schedule(form)
        form.addRow("Pause when the GPU is above", fields.temp)
        form.addRow("Keep the GPU busy at most", fields.busy)
        lay.addLayout(form)
        lay.addStretch(1)

    def applied(self, settings: Settings) -> Settings:
        idle = float(self.idle.value()) if self.idle_only.isChecked() else 0.0
        return self.fields.applied(replace(settings, idle_minutes=idle))
