"""Constraints in, token masks out: specs, JSON-Schema analysis, backends and matchers."""

from corral.grammar.compiled import CompiledConstraint, CorruptEntry, StaleEntry
from corral.grammar.compiler import compile_constraint
from corral.grammar.errors import CompileUnavailable, ConstraintError, Unenforced
from corral.grammar.matcher import Matcher
from corral.grammar.spec import ConstraintKind, ConstraintSpec, JsonFormat
from corral.grammar.tokenizer import TokenizerInfo
from corral.grammar.version import ANALYSIS_VERSION

__all__ = [
    "ANALYSIS_VERSION",
    "CompileUnavailable",
    "CompiledConstraint",
    "ConstraintError",
    "ConstraintKind",
    "ConstraintSpec",
    "CorruptEntry",
    "JsonFormat",
    "Matcher",
    "StaleEntry",
    "TokenizerInfo",
    "Unenforced",
    "compile_constraint",
]
