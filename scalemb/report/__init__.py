"""Run reports and interactive maps: ``write_report`` (``scalemb report``), a self-contained HTML page with the
run's metrics and figures, and ``map_page``, a self-contained HTML canvas map that pans and zooms at 1e6 points."""
from .page import build_report, write_report

__all__ = ["build_report", "write_report"]
