"""Real SGLang programs (`sglang.lang` through `sgl.RuntimeEndpoint`) against a real `corral
serve`: gen with and without constraints, select with every choices method SGLang ships (its
scores checked against the model's own forward), fork and join over the radix cache, run_batch,
streaming and chat-template programs."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
import torch

sgl = pytest.importorskip(
    "sglang", reason="SGLang's frontend: make install (requirements/sglang.txt)"
)
from sglang.lang.choices import (  # noqa: E402
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
METHODS = [token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized]


@pytest.fixture(scope="module")
def backend(server):
    return sgl.RuntimeEndpoint(server.url, api_key=server.api_key, chat_template_name="chatml")


@pytest.fixture(scope="module")
def served_model():
    """The model as `corral serve` loads it by default (same dtype and weights)."""
    from corral.api.config import ServerConfig
    from corral.engine.loading.assets import load_model

    cfg = ServerConfig()
    return load_model(None, cfg.torch_dtype, "cpu", quantize=cfg.quantization)


def hit_tokens(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return float(re.search(r"^corral_radix_cache_hit_tokens_total (\S+)$", text, re.M).group(1))


@sgl.function
def extract(s):
    s += "Q: What is 12 + 30?\nA: " + sgl.gen("sum", max_tokens=6, dtype=int, temperature=0)
    s += "\nQ: Write pi to two decimals.\nA: "
    s += sgl.gen("pi", max_tokens=8, dtype=float, temperature=0)
    s += "\nA product code: " + sgl.gen("code", max_tokens=10, regex=r"[A-Z]{3}-[0-9]{2}")
    s += "\nA person as JSON: "
    s += sgl.gen("person", max_tokens=60, json_schema=json.dumps(SCHEMA), temperature=0)
    s += "\nA word: " + sgl.gen("free", max_tokens=4, temperature=0)


def test_gen_with_and_without_constraints(backend):
    state = extract.run(backend=backend)
    assert state.error() is None, state.error()
    # dtype is a regex (SGLang's REGEX_INT / REGEX_FLOAT) ended by a space or a newline
    assert re.fullmatch(r"[-+]?[0-9]+", state["sum"]), state["sum"]
    assert re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+", state["pi"]), state["pi"]
    int(state["sum"]), float(state["pi"])
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", state["code"])
    jsonschema.validate(json.loads(state["person"]), SCHEMA)
    assert isinstance(state["free"], str) and state["free"]
    assert state.get_meta_info("free")["completion_tokens"] == 4


def direct_logprobs(model, ids: list[int]) -> list[float]:
    """log P(ids[i] | ids[:i]) for i >= 1, from one forward pass of the served model."""
    from corral.engine.execution.batch import ForwardBatch

    pool = model.runner.make_kv_pool(len(ids))
    slots = torch.arange(len(ids), dtype=torch.int64)
    batch = ForwardBatch.from_sequences([ids], [slots], torch.arange(len(ids) - 1))
    lp = torch.log_softmax(model.runner.forward(batch, pool).float(), dim=-1)
    return lp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()


PROMPT = "Grass in summer is usually the colour"
CHOICES = [" green", " blue", " purple", " bright green"]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: type(m).__name__)
def test_select_scores_are_the_models_own(backend, served_model, smol_tokenizer, method):
    @sgl.function
    def pick(s):
        s += PROMPT + sgl.select("colour", choices=CHOICES, choices_method=method)

    state = pick.run(backend=backend)
    meta = state.get_meta_info("colour")
    scores = []
    for choice, entries in zip(CHOICES, meta["input_token_logprobs"], strict=True):
        ids = smol_tokenizer.encode(PROMPT + choice)
        expected = direct_logprobs(served_model, ids)
        start = len(ids) - len(entries)  # the entries are the last tokens of the prompt
        assert [tok for _, tok, _ in entries] == ids[start:]
        got = [lp for lp, _, _ in entries]
        assert got == pytest.approx(expected[start - 1 :], abs=2e-2)
        scores.append(sum(expected[start - 1 :]) / len(entries))
    normalized = meta["normalized_prompt_logprobs"]
    assert normalized == pytest.approx(scores, abs=2e-2)
    if method is token_length_normalized:  # the choice with the highest exact score wins
        assert state["colour"] == CHOICES[max(range(len(scores)), key=scores.__getitem__)]
    assert state["colour"] in CHOICES


@sgl.function
def facts(s, branches):
    s += "Here are three short facts about cats, one per line.\n"
    forks = s.fork(branches)
    for i, f in enumerate(forks):
        f += f"Fact {i + 1}:" + sgl.gen("fact", max_tokens=8, temperature=0, stop="\n")
    forks.join("concate_and_append")


def test_fork_branches_share_the_prefix_and_join_in_order(backend, server, smol_tokenizer):
    prefix = len(smol_tokenizer.encode("Here are three short facts about cats, one per line.\n"))
    before = hit_tokens(server)
    state = facts.run(branches=3, backend=backend)
    text = state.text()
    assert state.error() is None, state.error()
    positions = [text.index(f"Fact {i}:") for i in (1, 2, 3)]
    assert positions == sorted(positions)
    # each branch's request found the prefix the fork cached (all but its last token or so)
    assert hit_tokens(server) - before >= 3 * (prefix - 2)


@sgl.function
def ask(s, question):
    s += sgl.system("You answer in a few words.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=10, temperature=0))


def test_chat_template_program_run_batch_and_stream(backend):
    state = ask.run(question="Name a fruit.", backend=backend)
    assert "<|im_start|>system\nYou answer in a few words.<|im_end|>" in state.text()
    assert "<|im_start|>assistant\n" in state.text() and state["answer"]
    states = ask.run_batch(
        [{"question": "Name a fruit."}, {"question": "Name a colour."}],
        backend=backend,
        num_threads=2,
    )
    assert states[0]["answer"] == state["answer"]  # greedy, same prompt: same text, in order
    assert states[1]["answer"] and states[1].text() != states[0].text()
    streamed = ask.run(question="Name a fruit.", stream=True, backend=backend)
    assert "".join(streamed.text_iter("answer")) == state["answer"]
