"""Constraints in, token masks out: specs, JSON-Schema analysis, backends and matchers."""

from corral.grammar.core.compiled import CompiledConstraint, CorruptEntry, StaleEntry
from corral.grammar.core.compiler import compile_constraint
from corral.grammar.core.errors import CompileUnavailable, ConstraintError, Unenforced
from corral.grammar.core.mask_batch import MaskBatchFiller, fill_row
from corral.grammar.core.matcher import Matcher
from corral.grammar.core.spec import ConstraintKind, ConstraintSpec, JsonFormat
from corral.grammar.core.tokenizer import TokenizerInfo
from corral.grammar.core.version import ANALYSIS_VERSION

__all__ = [
    "ANALYSIS_VERSION",
    "CompileUnavailable",
    "CompiledConstraint",
    "ConstraintError",
    "ConstraintKind",
    "ConstraintSpec",
    "CorruptEntry",
    "JsonFormat",
    "MaskBatchFiller",
    "Matcher",
    "StaleEntry",
    "TokenizerInfo",
    "Unenforced",
    "compile_constraint",
    "fill_row",
]
