"""Reusable widgets of the window (the QtCharts plots)."""
