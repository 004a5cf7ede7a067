"""Icons drawn in code (no image files to bundle): one look per agent state."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap

from desktop.agent import State

ACCENT = "#0E9F8E"
COLORS: dict[str, str] = {
    "idle": "#5B6B7F",
    "starting": "#5B6B7F",
    "stopped": "#8A94A6",
    "working": ACCENT,
    "paused": "#E0A100",
    "waiting": "#E0A100",
    "error": "#D64545",
}
LABELS: dict[str, str] = {
    "idle": "Ready, waiting for work",
    "starting": "Starting…",
    "stopped": "Stopped",
    "working": "Training",
    "paused": "Paused",
    "waiting": "Waiting",
    "error": "Needs attention",
}


def state_color(state: State | str) -> QColor:
    return QColor(COLORS.get(str(state), COLORS["idle"]))


def _chip(p: QPainter, r: QRectF, color: QColor) -> None:
    """A GPU chip: a rounded square with pins, in the state's colour."""
    pin = QPen(color, r.width() * 0.06)
    pin.setCapStyle(Qt.PenCapStyle.RoundCap)
    p.setPen(pin)
    for i in range(3):
        t = r.left() + r.width() * (0.3 + 0.2 * i)
        u = r.top() + r.height() * (0.3 + 0.2 * i)
        p.drawLine(QPointF(t, r.top() + r.height() * 0.04), QPointF(t, r.top() + r.height() * 0.16))
        p.drawLine(
            QPointF(t, r.bottom() - r.height() * 0.16), QPointF(t, r.bottom() - r.height() * 0.04)
        )
        p.drawLine(QPointF(r.left() + r.width() * 0.04, u), QPointF(r.left() + r.width() * 0.16, u))
        p.drawLine(
            QPointF(r.right() - r.width() * 0.16, u), QPointF(r.right() - r.width() * 0.04, u)
        )
    body = r.adjusted(r.width() * 0.16, r.height() * 0.16, -r.width() * 0.16, -r.height() * 0.16)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(color)
    p.drawRoundedRect(body, r.width() * 0.1, r.width() * 0.1)


def _badge(p: QPainter, r: QRectF, state: str) -> None:
    """The state's glyph in white on the chip: play, pause bars, exclamation, dots."""
    c = r.center()
    s = r.width() * 0.16
    p.setBrush(QColor("white"))
    p.setPen(Qt.PenStyle.NoPen)
    if state == "working":
        path = QPainterPath(QPointF(c.x() - s * 0.7, c.y() - s))
        path.lineTo(QPointF(c.x() + s, c.y()))
        path.lineTo(QPointF(c.x() - s * 0.7, c.y() + s))
        path.closeSubpath()
        p.drawPath(path)
    elif state in ("paused", "waiting"):
        p.drawRect(QRectF(c.x() - s * 0.8, c.y() - s, s * 0.55, 2 * s))
        p.drawRect(QRectF(c.x() + s * 0.25, c.y() - s, s * 0.55, 2 * s))
    elif state == "error":
        p.drawRect(QRectF(c.x() - s * 0.22, c.y() - s, s * 0.44, s * 1.25))
        p.drawEllipse(QPointF(c.x(), c.y() + s * 0.8), s * 0.25, s * 0.25)
    else:
        for dx in (-0.8, 0.0, 0.8):
            p.drawEllipse(QPointF(c.x() + dx * s, c.y()), s * 0.28, s * 0.28)


def state_pixmap(state: State | str, size: int = 64) -> QPixmap:
    pm = QPixmap(size, size)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    r = QRectF(0, 0, size, size)
    _chip(p, r, state_color(state))
    _badge(p, r, str(state))
    p.end()
    return pm


def state_icon(state: State | str) -> QIcon:
    icon = QIcon()
    for size in (16, 22, 32, 48, 64, 128):
        icon.addPixmap(state_pixmap(state, size))
    return icon


def app_icon() -> QIcon:
    return state_icon("working")
