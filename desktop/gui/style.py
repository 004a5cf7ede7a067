"""One stylesheet for every window: light cards on a soft background, one accent colour."""

from __future__ import annotations

from desktop.gui.icons import ACCENT

STYLE = f"""
QWidget {{ font-size: 13px; color: #1F2933; }}
QWidget#page, QDialog, QWizard {{ background: #F4F6F8; }}
QFrame#card {{ background: white; border: 1px solid #E1E5EA; border-radius: 10px; }}
QLabel#title {{ font-size: 20px; font-weight: 600; }}
QLabel#cardTitle {{ font-size: 11px; font-weight: 600; color: #6B7785;
                   letter-spacing: 1px; text-transform: uppercase; }}
QLabel#big {{ font-size: 24px; font-weight: 600; }}
QLabel#muted {{ color: #6B7785; }}
QLabel#pill {{ color: white; border-radius: 11px; padding: 3px 12px; font-weight: 600; }}
QPushButton {{ background: white; border: 1px solid #CBD2D9; border-radius: 6px;
              padding: 6px 16px; }}
QPushButton:hover {{ border-color: {ACCENT}; }}
QPushButton#primary {{ background: {ACCENT}; color: white; border: none; font-weight: 600; }}
QProgressBar {{ background: #E6EAEE; border: none; border-radius: 5px; height: 10px;
               text-align: center; font-size: 10px; }}
QProgressBar::chunk {{ background: {ACCENT}; border-radius: 5px; }}
QPlainTextEdit {{ background: #FAFBFC; border: 1px solid #E1E5EA; border-radius: 6px;
                 font-family: monospace; font-size: 11px; }}
QLineEdit, QComboBox {{
    background: white; border: 1px solid #CBD2D9; border-radius: 5px; padding: 4px 6px; }}
QAbstractSpinBox {{ min-height: 24px; }}
QTabWidget::pane {{ border: 1px solid #E1E5EA; border-radius: 8px; background: white; top: -1px; }}
QTabBar::tab {{ padding: 7px 16px; border: none; color: #6B7785; }}
QTabBar::tab:selected {{ color: {ACCENT}; border-bottom: 2px solid {ACCENT}; font-weight: 600; }}
QMenu {{ background: white; border: 1px solid #D5DBE1; border-radius: 8px; padding: 6px; }}
QMenu::item {{ padding: 7px 28px 7px 12px; border-radius: 5px; }}
QMenu::item:selected {{ background: #E7F6F4; color: #0B5F55; }}
QMenu::item:disabled {{ color: #52606D; }}
QMenu::separator {{ height: 1px; background: #E6EAEE; margin: 5px 8px; }}
"""
