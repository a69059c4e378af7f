"""Incremental detokenization: never half a UTF-8 character, stop strings cut and held back."""

from __future__ import annotations

from corral.engine.serving.detokenize import Detokenizer

TEXT = "Grüße 🦙🐪 — 東京は晴れ. naïve café ✓ done"


def _stream(tokenizer, ids, stop=()):
    d = Detokenizer(tokenizer, [], stop)
    deltas = []
    for t in ids:
        d.add(t)
        if d.find_stop():
            deltas.append(d.take(final=True))
            return deltas, True
        deltas.append(d.take())
    d.flush()
    deltas.append(d.take(final=True))
    return deltas, False


def _splits_a_character(tokenizer, ids) -> bool:
    return any("\ufffd" in tokenizer.decode([t]) for t in ids)


def test_multibyte_characters_are_never_split(llama3_tokenizer, smollm2):
    for tok in (llama3_tokenizer.hf_tokenizer, smollm2.tokenizer):
        ids = tok.encode(TEXT, add_special_tokens=False)
        assert _splits_a_character(tok, ids)  # the test needs a character spanning tokens
        deltas, _ = _stream(tok, ids)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == TEXT


def test_stop_string_is_cut_and_partial_matches_held_back(llama3_tokenizer):
    tok = llama3_tokenizer.hf_tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    deltas, stopped = _stream(tok, ids, stop=("晴れ",))
    assert stopped
    assert "".join(deltas) == TEXT[: TEXT.index("晴れ")]
    # A tail that could start a stop string is held back until it cannot.
    d = Detokenizer(tok, [], stop=("done!",))
    for t in ids:
        d.add(t)
        d.find_stop()
        d.take()
    assert d.text.endswith("done") and d.emitted == len(d.text) - len("done")
    d.flush()
    assert d.take(final=True) == "done"


def test_prompt_context_does_not_leak_into_output(smollm2):
    tok = smollm2.tokenizer
    prompt = tok.encode("Hello there, how are", add_special_tokens=False)
    out = tok.encode(" you today?", add_special_tokens=False)
    d = Detokenizer(tok, prompt)
    for t in out:
        d.add(t)
    d.flush()
    assert d.take(final=True) == " you today?"
