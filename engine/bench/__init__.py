"""Benchmarking: timing statistics (the GPU timing loop builds on these)."""

from .stats import (
    OutlierMarks,
    SpeedupEstimate,
    TimingStats,
    flag_throttled,
    mark_outliers,
    median_rel_err,
    should_stop,
    speedup_ci,
    summarize,
)

__all__ = [
    "OutlierMarks", "SpeedupEstimate", "TimingStats", "flag_throttled", "mark_outliers", "median_rel_err",
    "should_stop", "speedup_ci", "summarize",
]
