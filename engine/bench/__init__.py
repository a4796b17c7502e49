"""Benchmarking: timing statistics (the GPU timing loop builds on these)."""

from .stats import (
    SpeedupEstimate,
    TimingStats,
    flag_throttled,
    median_rel_err,
    should_stop,
    speedup_ci,
    summarize,
)

__all__ = [
    "SpeedupEstimate", "TimingStats", "flag_throttled", "median_rel_err", "should_stop", "speedup_ci", "summarize",
]
