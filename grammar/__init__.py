"""Constraints in, token masks out: specs, JSON-Schema analysis, backends and matchers."""

from corral.grammar.compiled import CompiledConstraint, CorruptEntry
from corral.grammar.compiler import compile_constraint
from corral.grammar.errors import CompileUnavailable, ConstraintError, Unenforced
from corral.grammar.matcher import Matcher
from corral.grammar.spec import ConstraintKind, ConstraintSpec, JsonFormat
from corral.grammar.tokenizer import TokenizerInfo

__all__ = [
    "CompileUnavailable",
    "CompiledConstraint",
    "ConstraintError",
    "ConstraintKind",
    "ConstraintSpec",
    "CorruptEntry",
    "JsonFormat",
    "Matcher",
    "TokenizerInfo",
    "Unenforced",
    "compile_constraint",
]
