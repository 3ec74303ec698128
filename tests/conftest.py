"""Say where the browser test left its screenshots, after pytest's own summary."""

from pathlib import Path

SCREENSHOTS = Path(__file__).resolve().parents[1] / "_build" / "screenshots"


def pytest_terminal_summary(terminalreporter):
    shots = sorted(SCREENSHOTS.glob("*.png"))
    if shots:
        terminalreporter.write_line(f"screenshots of {len(shots)} chapter pages: {SCREENSHOTS}")
