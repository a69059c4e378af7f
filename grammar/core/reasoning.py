"""A free reasoning block in front of a constraint (``ConstraintSpec.after_reasoning``).

Reasoning models (DeepSeek-R1, Qwen3) think in a block — ``<think>`` … ``</think>`` — before
they answer. The block is free text; the constraint applies from the end marker on, so a
constraint is never dropped because a model reasons first. The answer is a sub-grammar with its
own lexer, so the reasoning text and the answer's lexemes never mix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def after_reasoning(
    grammar: str,
    open_marker: str,
    close_marker: str,
    special_token: Callable[[str], int | None],
) -> str:
    """``grammar`` (llguidance grammar text) preceded by: optionally ``open_marker``, any text
    without ``close_marker``, ``close_marker``, and up to 8 whitespace characters. A marker that is one special token of the
    tokenizer is matched as that token."""
    answer = _as_grammar_list(grammar)
    answer[0]["name"] = "corral_answer"
    close = special_token(close_marker)
    if close is not None:
        think, lexemes = f"THINK <[{close}]>", [r"THINK: /(?s:.*)/"]
    else:
        think = "think_end"
        lexemes = [r"THINK: /(?s:.*)/", f"think_end[lazy]: THINK {json.dumps(close_marker)}"]
    opening = ""
    if open_marker:
        opener = special_token(open_marker)
        opening = f"({json.dumps(open_marker) if opener is None else f'<[{opener}]>'})? "
    # models write a line break or two between the block and the answer
    lexemes.append(r"GAP: /[ \t\r\n]{1,8}/")
    wrapper = "\n".join([f"start: {opening}{think} GAP? @corral_answer", *lexemes])
    return json.dumps({"grammars": [{"name": "corral_reasoned", "lark_grammar": wrapper}, *answer]})


def _as_grammar_list(grammar: str) -> list[dict[str, Any]]:
    """Grammar text (a TopLevelGrammar as JSON, or Lark) as a list of grammar objects."""
    stripped = grammar.lstrip()
    if stripped.startswith("{"):
        return list(json.loads(stripped)["grammars"])
    return [{"lark_grammar": grammar}]
