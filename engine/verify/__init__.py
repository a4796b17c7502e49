"""Verification: the tolerance table and the comparison of a candidate's outputs with eager's."""

from .compare import CHUNK_NUMEL, CompareReport, bitwise_equal, compare, compare_outputs
from .tolerance import (
    EXACT,
    FAMILIES,
    TableRow,
    Tolerance,
    op_family,
    split_op,
    table_rows,
    tolerance_for,
    tolerances_for,
)

__all__ = [
    "CHUNK_NUMEL", "EXACT", "FAMILIES", "CompareReport", "TableRow", "Tolerance", "bitwise_equal",
    "compare", "compare_outputs", "op_family", "split_op", "table_rows", "tolerance_for", "tolerances_for",
]
