"""Answer extraction from completions and answer matching against a reference.

Extraction styles (`extract_answer`), each linear in the completion's length:
  tags         the last `<answer>...</answer>` with something in it: a closing tag and the
               nearest opening tag before it
  boxed        the last outermost `\\boxed{...}` (or `\\fbox{...}`) with something in it, nested
               braces balanced; a box that only wraps another box is unwrapped
  gsm8k        the text after the last `####` whose line states a number (`stated_number`), of
               the last GSM8K_LINES such lines, so a markdown heading such as `#### Step 2` is
               not taken for the answer
  last_number  the last number: `-12`, `1,000`, `3.5`, `3/4`, `\\frac{3}{4}`; none when it ends
               a hedge (`4 or 3`)
  auto         the first of tags, boxed, gsm8k, a stated answer in the completion's tail
               ("The final answer is $...$", "The answer is 18", "**Answer:** B"; none for a
               hedge "18 or 26"), the math of its last sentence (`_final_math`), a completion
               that is one short piece of math (`_whole_math`), last_number that finds
               something; inside `<answer>` a `\\boxed{}` is unwrapped

Matching (`answers_match`; docs/rewards.md, "What `correct` pays for"). A reference that cannot be
scored (`usable_gold`: empty, NaN, `None`, `0/0`) matches nothing, and the reward leaves its row
unscored. Otherwise, after a leading "The answer is":
  - the reference's own surface form (after `normalize_answer`) matches; letters differing in
    case only match as words (`Yes`), never as commands (`\\delta` is not `\\Delta`);
  - a reference that states a number (`stated_number`: `72`, `-1,000.5`, `\\frac{3}{4}`,
    `12\\text{ inches}`) is matched by a stated number of the same value, and by nothing else
    when `strict` (the default): an integer, a decimal or a reduced fraction, with its dressing
    (sign, thousands separators, a currency, units in words, a leading `x =` or `\\approx`,
    markdown emphasis). A percentage is its value over 100 (`75%` for 0.75), or the number
    itself where the prompt asks for a percentage. `25+4`, `2^{10}`, `\\binom{8}{4}`,
    `\\frac{58}{2}` are not answers, whatever they equal: a policy paid for them learns to copy
    the question; nor, when `strict`, the prompt's own number in another form than the
    reference's (0.75 for "Express 0.75 as a common fraction": `_converts_back`);
  - a reference that lists numbers (`2, 3`) is matched by the same numbers in any order,
    however joined (`x=2 \\text{ or } x=3`);
  - any other reference (`\\frac{\\sqrt{2}}{2}`, `(x+1)^2`) is compared symbolically through
    math-verify (extra `math`), except, when `strict`, an answer that still shows work the
    reference has done (`_undone`: a decimal for an exact value, a root as a power or of a
    number that is not square-free, brackets multiplied where the reference is expanded or
    expanded where it is factored, letters in a denominator the reference has not), that
    restates the prompt (`_restates`), chains equalities, or names another variable;
  - `strict=False` (`reward.answer_match: lenient`) sends any pair that is not two equal numbers
    to math-verify and lets restated expressions match: the matching before strict existed.
Numbers are bounded before they are built (MAX_ANSWER_CHARS, MAX_EXPONENT), and math-verify
sees only short answers and references without huge powers, factorials of brackets, gamma,
products or sums (`_tame`), each comparison bounded by `oncurve.rewards.math` (TimeoutError past
it).
"""

from __future__ import annotations

import bisect
import collections
import math
import re
from fractions import Fraction

STYLES = ("auto", "tags", "boxed", "gsm8k", "last_number")
# A stated answer is at most this long, so no digit run reaches Python's 4,300-digit int limit.
MAX_ANSWER_CHARS = 1000
MAX_EXPONENT = 1000  # `1e999999999` would build a billion-digit integer
MAX_SYMBOLIC_CHARS = 100
GSM8K_LINES = 8  # `####` lines, from the last, that the gsm8k style reads
TAIL_CHARS = 2000  # the end of a completion where a stated "final answer is $...$" is read

_OPEN_TAG_RE = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG_RE = re.compile(r"</answer>", re.IGNORECASE)
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
# Thousands groups must be exact (`1,000`, not `1,00`), so a list like `1,2,3` gives `3`.
_NUMBER = (
    r"[-−]?\\[dtc]?frac\{\d+\}\{\d+\}"  # a fraction whole, not its denominator
    r"|[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-−]?\.\d+"
)
# A unit may follow without a space (`12.5m`); a letter before (`x2`, `H2O`) is no number.
_NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})(?![\d_]|[.,]\d)")
_STATED_ANSWER_RE = re.compile(
    r"answer\s*(?:is|:)\s*(?:\*\*)?\s*(?:\$\$?(?P<math>(?:\\\$|[^$]){1,500})\$"
    r"|\\\((?P<inline>.{1,500}?)\\\))",
    re.IGNORECASE,
)
_SCALE_WORDS = r"thousand|million|billion|trillion"
_ANSWER_NUMBER_RE = re.compile(
    rf"answer\s*(?:is|:)\s*(?:\*\*)?\s*\\?\$?\s*(?P<number>(?:{_NUMBER})(?![\d_]|[.,]\d)"
    rf"(?:\s+(?:{_SCALE_WORDS})\b)?)(?P<hedge>\s*(?:\$\s*)?(?:or|and/or)\s+\$?[-−]?\d)?",
    re.IGNORECASE,
)
# "The answer is East." / "The answer is (C)." / "**Answer:** B": a word or a choice's letter
_ANSWER_WORD_RE = re.compile(
    r"answer\s*(?:is|:)\s*(?:\*\*)?\s*(?P<word>\([A-Za-z]\)|[A-Za-z]+)\s*(?:\*\*)?\s*[.!]?\s*$",
    re.IGNORECASE,
)
# The last sentence of a completion's tail (after its last `. `, `! `, `? ` or line break).
# Where a sentence ends: `. `, `! `, `? ` (a decimal point has a digit after it), `$$ ` after a
# displayed formula's period, or a line break.
_SENTENCE_END_RE = re.compile(r"[.!?]\$*\s+|\n")
_STATES_NUMBER_RE = re.compile(r"\b(?:is|are|was|were|equals?|be)\s+\\?\$?[-−]?\d")
_LHS_NAME_RE = re.compile(r"\s*[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?\s*")
_INLINE_MATH_RE = re.compile(r"(?<!\\)\$\$?((?:\\\$|[^$]){1,500})\$\$?")
_JOINER_RE = re.compile(r"\s*(?:,|and|or|,\s*and|,\s*or)\s*", re.IGNORECASE)
# A number, then "or" (or "and/or") just before the last one: an answer that hedges.
_HEDGE_RE = re.compile(r"\d\s*(?:\$\s*)?(?:or|and/or)\s*(?:\$\s*)?[-−]?$", re.IGNORECASE)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
# A box opener with the brace of its argument (group 1) or its unbraced argument (group 2,
# `\boxed 7`), or any other brace: one pass over these finds every box (`_last_boxed`).
_BOX_TOKEN_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])(?:[ \t]*(\{)|[ \t]+([^\s${}\\]+))?|[{}]")
_NON_SPACE_RE = re.compile(r"\S")

_TEXT_RE = re.compile(
    r"\\(?:text|textbf|textrm|textit|textnormal|textup|mathrm|mathbf|mathit|mathsf|mbox|bm"
    r"|boldsymbol|underline)\s*\{([^{}]*)\}"
)
# A spacing command's backslash is not the second of a row break `\\\\` (`\\\\ 2` keeps its row).
_SPACING_RE = re.compile(r"\\left|\\right|\\displaystyle|(?<!\\)\\[,;:! ]")
_WRAPPERS = (("**", "**"), ("__", "__"), ("*", "*"), ("`", "`"), ("$$", "$$"), ("$", "$"))
_WRAPPERS += (("\\(", "\\)"), ("\\[", "\\]"), ("(", ")"))
_STATED_RE = re.compile(
    r"""(?:(?:[a-zA-Z]{1,3}(?:_\{?[a-zA-Z0-9]+\}?)?|\\[a-zA-Z]+)\s*=|\\approx|≈|=)?\s*
    (?P<sign>[-+]?)\s*(?:\$|€|£|¥|₹|₩|₽)?\s*(?P<sign2>[-+]?)\s*
    (?:
        (?:(?P<mixed>\d+)\s*)?
        \\frac\s*(?:\{\s*(?P<fnum>-?\d+)\s*\}|(?P<fnum1>\d))
                \s*(?:\{\s*(?P<fden>-?\d+)\s*\}|(?P<fden1>\d))
      | (?P<rnum>\d+)\s*/\s*(?P<rden>\d+)
      | (?P<whole>\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))
        (?:\.(?P<decimals>\d*)(?:\\overline\s*\{\s*(?P<repeat>\d+)\s*\})?)?
        (?:[eE](?P<exp>[-+]?\d+)
          |\s*(?:\\times|\\cdot|×|·)\s*10\s*\^\s*(?:\{\s*(?P<exp2>[-+]?\d+)\s*\}|(?P<exp1>\d)))?
    )
    \s*(?P<percent>%)?(?:\^\s*\{?\s*\\circ\s*\}?|\\circ|°)?
    (?:\s*(?P<scale>thousand|million|billion|trillion)\b)?
    (?P<words>(?:\s+|(?=[a-zA-Z]{2}))[a-zA-Z]+(?:[ /-]+[a-zA-Z]+){0,3}(?:\^\{?\d\}?)?)?
    \s*\.?""",
    re.VERBOSE,
)
# Words after a number that scale it: `70 thousand`, `$1.45 million`.
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
# Words after a number that change its value or deny it: `5 squared`, `5 is not the answer`.
_NOT_UNITS = frozenset(
    [
        "is",
        "are",
        "was",
        "were",
        "be",
        "not",
        "no",
        "nor",
        "or",
        "and",
        "but",
        "than",
        "never",
        "thousand",
        "thousands",
        "million",
        "millions",
        "billion",
        "billions",
        "trillion",
        "trillions",
        "hundred",
        "hundreds",
        "dozen",
        "dozens",
        "squared",
        "cubed",
        "times",
        "plus",
        "minus",
        "over",
        "half",
        "quarter",
    ]
)
_PERCENT_WORDS = frozenset(("percent", "per cent", "percentage points"))
_PERCENT_PROMPT_RE = re.compile(r"percent|%", re.IGNORECASE)

_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
_ENVIRONMENT_RE = re.compile(r"\\(?:begin|end)\s*\{[a-zA-Z*]+\}")
_TEXT_COMMAND_RE = re.compile(r"\\(?:text|textnormal|mathrm|mbox)\b")
_TRAILING_UNITS_RE = re.compile(
    r"\s*\\(?:text|textnormal|mathrm|mbox)\s*\{(?P<words>\s*[a-zA-Z][a-zA-Z ./-]*)\}"
    r"\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*\.?\s*$"
)
_CHOICE_RE = re.compile(r"\(?(?P<letter>[A-Ea-e])\)?")
_EQUALS_RE = re.compile(r"(?<![<>!\\])=")
_LHS_RE = re.compile(r"\s*(?P<name>[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?)\s*=(?!=)")
_MALFORMED_GOLDS = frozenset(("nan", "none", "null", "n/a", "0/0"))
_OVER_ZERO_RE = re.compile(
    r"\\[dtc]?frac\s*\{[^{}]*\}\s*\{\s*0+\s*\}|(?<![\d.])\d+\s*/\s*0+(?![\d.])"
)
_ANSWER_PHRASE_RE = re.compile(
    r"\s*(?:(?:so|thus|therefore|hence),?\s+)?(?:the\s+)?(?:final\s+)?answer\s*(?:is|:|=)\s*"
    r"(?P<answer>.+?)\s*\.?\s*",
    re.IGNORECASE | re.DOTALL,
)
# A literal number of a prompt: a fraction (LaTeX or a/b) or a decimal, for `_converts_back`.
_PROMPT_NUMBER_RE = re.compile(
    r"\\[dtc]?frac\s*(?:\{\s*\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)|\d+\s*/\s*\d+|\d*\.\d+"
)
_LIST_SEPARATOR_RE = re.compile(r"\s*(?:,(?!\d{3}(?!\d))|;|\bor\b|\band\b)\s*")
_DECIMAL_RE = re.compile(r"\d\.\d|(?<!\d)\.\d")
# A power that is a root: `^{1/2}`, `^{\frac{1}{3}}`, `^(1/2)`, `^{0.5}`, `^.5`
_FRACTIONAL_POWER_RE = re.compile(
    r"\^\s*[{(]?\s*(?:\\[dtc]?frac\s*\{?\s*\d+\s*\}?\s*\{?\s*\d+|\d+\s*/\s*\d+|\d*\.\d)"
)
_SQRT_RE = re.compile(r"\\sqrt(?:\s*\[\s*(?P<index>2)\s*\])?\s*|(?<![a-zA-Z\\])sqrt\s*")
# Brackets multiplied or raised: `(x+1)(x+1)`, `(1+x)^2`, `2(x+1)`, `(x+1) \cdot (x-1)`
_BRACKET_PRODUCT_RE = re.compile(r"\)\s*(?:\\cdot|\\times|\*)?\s*[(\^]|[\w}]\s*\(")
_FRAC_RE = re.compile(r"\\[dtc]?frac\s*\{")
# An operation between terms, a power, a factorial, a command or a bracket: not a bare number
# or symbol (`-1` is not one).
_EXPRESSION_RE = re.compile(r".[-+*/^!]|\\[a-zA-Z]|\(")
_MATH_SEGMENT_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# Operators whose value sympy computes however large: factorials of brackets (`(x-x+9999999)!`,
# `(3!)!`), the gamma function, products and sums.
_UNBOUNDED_RE = re.compile(r"[)}\]]\s*!|\\(?:Gamma|prod|sum|operatorname\s*\{\s*[a-zA-Z]*\s*\})")
_EXPLOSIVE_RE = re.compile(
    r"\d{21,}"  # a number past any answer's size
    r"|\d[eE][-+]?\d{4,}"  # 1e999999999
    r"|!\s*!"  # 9!!!: factorials of factorials
    r"|\d{4,}\s*!"  # 99999!
)


def extract_answer(text: str, style: str = "auto") -> str | None:
    """The answer part of a completion, stripped, or None when `style` finds none."""
    if style not in STYLES:
        raise ValueError(f"extract_answer: style must be one of {', '.join(STYLES)}, got {style!r}")
    if style == "auto":
        tagged = _last_tag(text)
        if tagged is not None:
            return _last_boxed(tagged) or tagged
        finders = (_last_boxed, _gsm8k, _stated_answer, _final_math, _whole_math, _last_number)
        for finder in finders:
            found = finder(text)
            if found is not None:
                return found
        return None
    return {"tags": _last_tag, "boxed": _last_boxed, "gsm8k": _gsm8k, "last_number": _last_number}[
        style
    ](text)


def answers_match(
    predicted: str | None, gold: str, *, prompt: str | None = None, strict: bool = True
) -> bool:
    """True when `predicted` states the same answer as `gold` (see the module docstring);
    `prompt`, when given, is the question a strict match must not be paid for restating.
    Raises TimeoutError when math-verify runs past its bound (the reward runner counts that
    row as a timeout)."""
    if predicted is None or usable_gold(gold) is None:
        return False
    gold = str(gold)
    predicted = _answer_phrase(predicted)
    if strict and (_chained(predicted) or _other_variable(predicted, gold)):
        return False
    if not _TEXT_COMMAND_RE.search(gold):
        predicted = _without_units(predicted)
    pred, ref = normalize_answer(predicted), normalize_answer(gold)
    if not pred:
        return False
    same_percent = bool(_PERCENT_PROMPT_RE.search(predicted)) == bool(
        _PERCENT_PROMPT_RE.search(gold)
    )
    # letters' case is a word's spelling (`Yes`), but a command's meaning (`\delta`, `\Delta`)
    if same_percent and (pred == ref or ("\\" not in pred + ref and pred.lower() == ref.lower())):
        return True
    if pred.lower() == ref.lower() and pred != ref and "\\" in pred + ref:
        return False
    choice = _CHOICE_RE.fullmatch(pred), _CHOICE_RE.fullmatch(ref)
    if all(choice):  # a multiple choice's letter, with or without its brackets: `B` for `(B)`
        return choice[0]["letter"].upper() == choice[1]["letter"].upper()
    gold_stated = _stated(gold)
    pred_stated = _stated(predicted, reduced=strict)
    if gold_stated is not None and pred_stated is not None:
        if not _same_value(pred_stated, gold_stated, prompt):
            return False
        return not (strict and prompt and _converts_back(pred_stated, gold_stated, prompt))
    if strict and gold_stated is not None:
        return False
    if gold_stated is not None:
        ref = str(gold_stated[0])
    gold_list = _number_list(gold)
    if gold_list is not None:
        pred_list = _number_list(predicted, reduced=strict)
        if pred_list is not None or strict:
            return pred_list is not None and sorted(pred_list) == sorted(gold_list)
    if not (_looks_symbolic(pred) and _looks_symbolic(ref) and _tame(pred) and _tame(ref)):
        return False
    if strict and (_undone(pred, ref) or (prompt and _restates(pred, prompt, ref))):
        return False
    from oncurve.rewards.math import symbolic_equal

    return bool(symbolic_equal(pred, ref))


def usable_gold(gold: object) -> str | None:
    """The reference answer as text, or None when it cannot be scored against: missing, empty,
    NaN, `None`, `null`, or a fraction over zero (`0/0`, `\\frac{1}{0}`). A policy that
    repeats a malformed reference learns nothing true, so such rows are unscored."""
    if gold is None or (isinstance(gold, float) and not math.isfinite(gold)):
        return None
    text = str(gold).strip()
    surface = normalize_answer(text).lower()
    if not surface or surface in _MALFORMED_GOLDS or _OVER_ZERO_RE.search(text):
        return None
    return text


def _chained(text: str) -> bool:
    """Whether a part of the answer chains equalities (`1 = 2 = 3 = 2\\sqrt{3}`): one of them
    at least is not the answer. A list of solutions (`x=2 \\text{ or } x=3`) is no chain."""
    if len(text) > MAX_ANSWER_CHARS:
        return False
    parts = _LIST_SEPARATOR_RE.split(_TEXT_RE.sub(r" \1 ", text))
    return any(len(_EQUALS_RE.findall(part)) > 1 for part in parts)


def _without_units(text: str) -> str:
    """`text` without units in `\\text{}` after it (`9\\pi \\text{ cm}^2`), words that change
    or deny the value (`\\text{ thousand}`, `\\text{ is not it}`) kept."""
    if len(text) > MAX_ANSWER_CHARS:
        return text
    match = _TRAILING_UNITS_RE.search(text)
    if match is None or _NOT_UNITS.intersection(re.split(r"[ ./-]+", match["words"].lower())):
        return text
    return text[: match.start()]


def _answer_phrase(text: str) -> str:
    """`text` without a leading "The answer is" (`<answer>The answer is 18.</answer>`)."""
    if len(text) > MAX_ANSWER_CHARS:
        return text
    match = _ANSWER_PHRASE_RE.fullmatch(text)
    return text if match is None else match["answer"]


def _other_variable(predicted: str, gold: str) -> bool:
    """Whether both name what they solve for, and not the same (`x = 2x+3` for `y=2x+3`)."""
    named = [_LHS_RE.match(_undress(text)) for text in (predicted, gold)]
    return all(named) and named[0]["name"] != named[1]["name"]


def _same_value(
    pred: tuple[Fraction, bool, str], gold: tuple[Fraction, bool, str], prompt: str | None
) -> bool:
    """Whether two stated numbers agree, a percentage read as such: `75%` is 0.75, and is 75
    only where the question asks for a percentage (or the gold writes one)."""
    (value, percent, _), (gold_value, gold_percent, _) = pred, gold
    if percent == gold_percent:
        return value == gold_value
    if percent:
        asked = prompt is None or _PERCENT_PROMPT_RE.search(prompt) is not None
        return value / 100 == gold_value or (asked and value == gold_value)
    return value in (gold_value, gold_value / 100)


def _converts_back(
    pred: tuple[Fraction, bool, str], gold: tuple[Fraction, bool, str], prompt: str
) -> bool:
    """Whether the answer is the prompt's own number in another form than the gold's: 0.75 for
    "Express 0.75 as a common fraction", `\\frac{7}{8}` for "Express 7/8 as a decimal"."""
    value, _, kind = pred
    if kind == gold[2]:
        return False
    literals = {"fraction": [], "decimal": [], "integer": []}
    for match in _PROMPT_NUMBER_RE.finditer(prompt[: 4 * MAX_ANSWER_CHARS]):
        stated = _stated(match.group())
        if stated is not None:
            literals[stated[2]].append(stated[0])
    return value in literals[kind]


def _number_list(text: str, *, reduced: bool = False) -> list[Fraction] | None:
    """The numbers of a bare list of two or more (`2, 3`; `x=2 \\text{ or } x=3`), or None."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    text = _TEXT_RE.sub(r" \1 ", text.strip())
    if _BOX_RE.search(text):
        text = _last_boxed(text) or text
    text = text.strip().strip("$").strip()
    if not text or text[0] in "([{" or "\\{" in text:  # a tuple, an interval or a set
        return None
    parts = _LIST_SEPARATOR_RE.split(text)
    if len(parts) < 2:
        return None
    values = [_stated(part, reduced=reduced) for part in parts]
    if any(v is None or v[1] for v in values):
        return None
    return [v[0] for v in values]


def _undone(pred: str, ref: str) -> bool:
    """Whether the normalised answer `pred` still shows work the reference `ref` has done: a
    decimal for an exact reference, a root written as a power or with index 2, a root of a
    number that is not square-free or of arithmetic, a product or power of brackets where the
    reference has none, a sum where the reference is a product or power of brackets, a
    fraction with letters in its denominator where the reference has none."""
    if _DECIMAL_RE.search(pred) and not _DECIMAL_RE.search(ref):
        return True
    if _FRACTIONAL_POWER_RE.search(pred) and not _FRACTIONAL_POWER_RE.search(ref):
        return True
    for radicand in _radicands(pred):
        if radicand in _radicands(ref):
            continue
        if not radicand.isdigit() or not _square_free(int(radicand)):
            return True
    if _bracket_product(pred) and "(" not in ref:
        return True
    if _bracket_product(ref) and "(" not in pred:  # expanded, where a factored form is asked
        return True
    if _letter_denominator(pred) and not _letter_denominator(ref):
        return True
    return _root_denominator(pred) and not _root_denominator(ref)  # not rationalised


def _bracket_product(text: str) -> bool:
    """Whether brackets are multiplied or raised in `text` (a function's own, `\\sin(x)`, are
    not)."""
    return _BRACKET_PRODUCT_RE.search(_COMMAND_RE.sub(" ", text)) is not None


def _radicands(text: str) -> list[str]:
    """What each square root of `text` is taken of: `\\sqrt{12}`, `\\sqrt 3`, `\\sqrt[2]{12}`
    (an index of 2 is `12^` undone: kept with its index, which never passes), `sqrt(12)`."""
    found = []
    for match in _SQRT_RE.finditer(text):
        if match["index"] is not None:
            found.append(f"[{match['index']}]")
            continue
        start = match.end()
        if start < len(text) and text[start] in "{(":
            close = _closing(text, start)
            found.append(text[start + 1 : close] if close is not None else text[start:])
        else:
            found.append(re.match(r"\d+|\\?[a-zA-Z]+|.?", text[start:]).group())
    return found


def _closing(text: str, start: int) -> int | None:
    """The index of the bracket that closes the one at `start` (`{` or `(`), or None."""
    opener = text[start]
    closer = "}" if opener == "{" else ")"
    depth = 0
    for end in range(start, min(len(text), start + MAX_ANSWER_CHARS)):
        depth += (text[end] == opener) - (text[end] == closer)
        if depth == 0:
            return end
    return None


def _square_free(n: int) -> bool:
    if n < 2:
        return False
    return all(n % (k * k) for k in range(2, math.isqrt(n) + 1))


def _root_denominator(text: str) -> bool:
    """Whether a fraction of `text` has a square root in its denominator (`\\frac{1}{\\sqrt{3}}`,
    `1/\\sqrt{3}`)."""
    return any("sqrt" in denominator for denominator in _denominators(text))


def _letter_denominator(text: str) -> bool:
    """Whether a fraction of `text` has a letter in its denominator (`\\frac{x^2-1}{x-1}`,
    `(x^2-1)/(x-1)`); command names (`\\sqrt`, `\\pi`) are no letters."""
    return any(
        re.search(r"[a-zA-Z]", _COMMAND_RE.sub("", denominator))
        for denominator in _denominators(text)
    )


def _denominators(text: str) -> list[str]:
    """The denominator of each fraction of `text`: `\\frac{a}{b}`'s `b`, and what follows a
    `/` (a bracket, a command with its argument, or a run of letters and digits)."""
    found = []
    for match in _FRAC_RE.finditer(text):
        numerator_end = _closing(text, match.end() - 1)
        if numerator_end is None or numerator_end + 1 >= len(text):
            continue
        if text[numerator_end + 1] == "{":
            end = _closing(text, numerator_end + 1)
            found.append(text[numerator_end + 2 : end])
        else:
            found.append(text[numerator_end + 1])
    for match in re.finditer(r"/\s*", text):
        after = text[match.end() :]
        if after.startswith("(") and (close := _closing(after, 0)) is not None:
            found.append(after[: close + 1])
        else:
            found.append(re.match(r"\\?[a-zA-Z0-9]*(?:\{[^{}]*\})?", after).group())
    return found


def normalize_answer(text: str) -> str:
    """Canonical surface form: a boxed answer unwrapped, no whitespace, `$`, trailing period,
    `\\text{}` wrapper, `\\left`/`\\right`, degree or percent sign, or leading `x =`."""
    text = text.strip()
    if _BOX_RE.search(text):
        text = _last_boxed(text) or text
    text = _SPACING_RE.sub("", _TEXT_RE.sub(r"\1", text))
    text = re.sub(r"\^\{?\\circ\}?|\\%|%", "", text)
    text = text.replace("\\$", "").replace("$", "")
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"^[a-zA-Z]=(?!=)", "", text)
    return text.rstrip(".")


def stated_number(text: str, *, reduced: bool = False) -> Fraction | None:
    """The value of `text` when it states one number: an integer, a decimal (`1e3`,
    `1.5 \\times 10^3`, `0.\\overline{3}` too), a fraction (`3/4`, `\\frac{3}{4}`, `\\dfrac34`,
    `\\frac{2}{-3}`) or a mixed number (`7\\frac{1}{2}`), with its dressing: sign, thousands
    separators (`1,000`, `1{,}000`, `1\\,000`), a currency sign, `%`, degrees, units in words or
    `\\text{}` (`72 apples`, `5\\text{ hours}`, `18\\text{ m}^2`), a leading `x =`, `AB =`,
    `x_1 =` or `\\approx`, markdown emphasis, math delimiters, brackets, a box, a trailing period.
    A percentage's value is the number as written (`answers_match` reads the `%`). With
    `reduced`, a fraction counts only in lowest terms with a denominator above 1 (`\\frac{58}{2}`
    is arithmetic left undone). None for anything else: words that change the value or deny it
    (`5 thousand`, `5 is not the answer`), an answer longer than MAX_ANSWER_CHARS or an exponent
    beyond MAX_EXPONENT."""
    stated = _stated(text, reduced=reduced)
    return None if stated is None else stated[0]


def _stated(text: str, *, reduced: bool = False) -> tuple[Fraction, bool, str] | None:
    """(value, whether it is a percentage, its kind: "integer", "decimal" or "fraction") of
    the number `text` states (`stated_number`)."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    match = _STATED_RE.fullmatch(_undress(text))
    if match is None or (match["sign"] and match["sign2"]):
        return None
    words = (match["words"] or "").strip().lower()
    if _NOT_UNITS.intersection(re.split(r"[ /-]+", words)):
        return None
    percent = bool(match["percent"]) or words in _PERCENT_WORDS
    sign = -1 if "-" in (match["sign"], match["sign2"]) else 1
    num, den = match["fnum"] or match["fnum1"] or match["rnum"], match["fden"] or match["fden1"]
    den = den or match["rden"]
    if num is not None:
        numerator, denominator = int(num), int(den)
        if denominator == 0 or (numerator < 0 and denominator < 0):
            return None
        if reduced and (abs(denominator) == 1 or math.gcd(numerator, denominator) != 1):
            return None
        value = Fraction(numerator, denominator)
        if match["mixed"] is not None:
            if not 0 < value < 1:  # `7\frac{1}{2}` is seven and a half; `7\frac{3}{2}` is not
                return None
            value += int(match["mixed"])
        return sign * value, percent, "fraction"
    decimals = match["decimals"] or ""
    exponent = int(match["exp"] or match["exp2"] or match["exp1"] or 0) - len(decimals)
    if abs(exponent) > MAX_EXPONENT:
        return None
    digits = (match["whole"].replace(",", "") + decimals) or "0"
    value = Fraction(int(digits))
    if match["repeat"]:  # 0.1\overline{6}: the repeated digits add digits / (10^k - 1)
        value += Fraction(int(match["repeat"]), 10 ** len(match["repeat"]) - 1)
    kind = "decimal" if match["decimals"] is not None or exponent < 0 else "integer"
    scale = _SCALES[match["scale"].lower()] if match["scale"] else 1
    return sign * value * Fraction(10) ** exponent * scale, percent, kind


def _undress(text: str) -> str:
    """`text` without what surrounds a stated number: a box, `\\text{}` (its words kept as
    words), spacing commands, math delimiters, markdown emphasis; `\\dfrac` as `\\frac`."""
    text = text.strip()
    if _BOX_RE.search(text):
        text = _last_boxed(text) or text
    text = _TEXT_RE.sub(r" \1 ", _TEXT_RE.sub(r" \1 ", text))  # `\bm{\text{18}}`
    text = re.sub(r",\s*\\[!,]\s*", ",", text)  # `32,\! 349`
    text = _SPACING_RE.sub("", re.sub(r"(?<!\\)\\ ", " ", text)).replace("~", " ")
    for old, new in (("{,}", ","), ("\\$", "$"), ("\\%", "%"), ("−", "-")):
        text = text.replace(old, new)
    text = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", text)
    text = re.sub(r"\s+(?=\^)", "", text)  # `18 m ^2`: a unit's power
    # one space at most between parts: _STATED_RE's adjacent optional spaces would split a long
    # run in quadratically many ways before failing
    text = re.sub(r"\s+", " ", text).strip()
    unwrapped = True
    while unwrapped:
        unwrapped = False
        for opener, closer in _WRAPPERS:
            wrapped = text.startswith(opener) and text.endswith(closer)
            if wrapped and len(text) > len(opener) + len(closer):
                text = text[len(opener) : -len(closer)].strip()
                unwrapped = True
    return text


def _restates(pred: str, prompt: str, ref: str) -> bool:
    """Whether the normalised answer `pred` restates the prompt: is an expression written in it,
    or wraps one of its math expressions that the reference `ref` does not hold (`\\sqrt{12}
    \\cdot 1` for "Simplify $\\sqrt{12}$"). Copying the question is not answering it. The
    reference's own form never restates (a prompt may offer it among choices)."""
    answer, reference = _canonical(pred), _canonical(ref)
    if not _EXPRESSION_RE.search(answer) or answer == reference:
        return False
    if answer in _canonical(prompt):
        return True
    for match in _MATH_SEGMENT_RE.finditer(prompt):
        segment = _canonical(next(group for group in match.groups() if group is not None))
        if _EXPRESSION_RE.search(segment) and segment in answer and segment not in reference:
            return True
    return False


def _canonical(text: str) -> str:
    """`text` as `_restates` compares it: without what only changes how an expression looks
    (whitespace, braces, `$`, spacing and sizing commands, `\\dfrac` for `\\frac`)."""
    return re.sub(r"[\s{}$]|(?<=\\)[dt](?=frac)", "", _SPACING_RE.sub("", text))


def _looks_symbolic(text: str) -> bool:
    """Worth a symbolic comparison: short, and no words outside LaTeX commands. Prose costs
    math-verify tens of milliseconds per row and never matches."""
    words = _COMMAND_RE.sub("", _ENVIRONMENT_RE.sub("", text))  # `\\begin{pmatrix}` is no prose
    return len(text) <= MAX_SYMBOLIC_CHARS and not re.search(r"[a-zA-Z]{4,}", words)


def _tame(text: str) -> bool:
    """Safe to hand to math-verify: no number that sympy would build in C, past any timeout's
    reach and with gigabytes of memory (a tower `9^{9^{9^{9}}}`, `9!!!`, `1e999999999`, a
    binomial of powers), whatever letters dress it (`(x-x+9999999)!` cancels to a number): no
    factorial of a bracket, no gamma function, product or sum operator, no power inside an
    exponent. Applied to the reference too. `text` is short (`_looks_symbolic`)."""
    if _EXPLOSIVE_RE.search(text) or _UNBOUNDED_RE.search(text):
        return False
    if re.search(r"\\(?:[dt]?binom|choose)", text) and re.search(r"\^|\d{4,}", text):
        return False
    return all(not re.search(r"\d{4,}|[\^!]", exponent) for exponent in _exponents(text))


def _exponents(text: str) -> list[str]:
    """What follows each `^`: a braced group, a command or one character."""
    found = []
    for match in re.finditer(r"\^\s*", text):
        start = match.end()
        if text.startswith("{", start):
            end = _closing(text, start)
            found.append(text[start + 1 : len(text) if end is None else end])
        else:
            found.append(re.match(r"\\[a-zA-Z]+|\d+|.?", text[start:]).group())
    return found


def _last_tag(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` pair with something in it: its closing
    tag and the nearest opening tag before it. Empty pairs (a format quoted) are passed over."""
    openings = [match.end() for match in _OPEN_TAG_RE.finditer(text)]
    for close in reversed(list(_CLOSE_TAG_RE.finditer(text))):
        before = bisect.bisect_right(openings, close.start()) - 1
        if before < 0:
            return None
        content = text[openings[before] : close.start()].strip()
        if content:
            return content
    return None


def _last_match(
    pattern: re.Pattern[str], text: str, end: int, start: int = 0
) -> re.Match[str] | None:
    """The last match of `pattern` in `text[start:end]`, in one pass (a lazy `.*?` search from
    each candidate start would rescan the rest of the text for each)."""
    last = collections.deque(pattern.finditer(text, start, end), maxlen=1)
    return last[0] if last else None


def _last_boxed(text: str) -> str | None:
    """Content of the last outermost `\\boxed{...}`, braces balanced (`\\boxed{\\frac{1}{2}}`);
    a box that only wraps another box is unwrapped. One pass over the braces: each box's
    argument ends where its brace closes, so nested or unclosed boxes cost no rescans."""
    first = _BOX_RE.search(text)
    if first is None:
        return None
    boxes: dict[int, tuple[int, int, int]] = {}  # box start -> (content start, end, box end)
    last = None  # the box that closed last: it is outermost, since one around it closes later
    open_braces: list[tuple[int, int] | None] = []  # (box start, content start) for a box's
    for token in _BOX_TOKEN_RE.finditer(text, first.start()):  # braces before it hold no box
        if token.group() == "{":
            open_braces.append(None)
        elif token.group() == "}":
            box = open_braces.pop() if open_braces else None
            if box is not None:
                boxes[box[0]] = (box[1], token.start(), token.end())
                # an empty box (a prompt's `\boxed{}` quoted) is no answer: the one before
                # it still is
                if _NON_SPACE_RE.search(text, box[1], token.start()):
                    last = box[0]
        elif token.group(1):
            open_braces.append((token.start(), token.end()))
        elif token.group(2):
            end = token.start(2) + len(token.group(2).rstrip("."))  # `\boxed 7.`
            boxes[token.start()] = (token.start(2), end, token.end())
            last = token.start()
    if last is None:
        return None
    start, end, _ = boxes[last]
    while True:
        first = _NON_SPACE_RE.search(text, start, end)
        if first is None or first.start() not in boxes:
            break
        inner_start, inner_end, inner_box_end = boxes[first.start()]
        stop = end
        while stop > inner_box_end and text[stop - 1].isspace():
            stop -= 1
        if stop != inner_box_end:
            break
        start, end = inner_start, inner_end
    return text[start:end].strip()


def _gsm8k(text: str) -> str | None:
    # The answer line is among the last few `####` lines (headings after it are few): checking
    # every line of a completion made of thousands would cost milliseconds each.
    for match in reversed(_GSM8K_RE.findall(text)[-GSM8K_LINES:]):
        answer = match.strip()
        if stated_number(answer) is not None:
            return answer
    return None


def _stated_answer(text: str) -> str | None:
    """The math of the completion's last "The final answer is $...$" (or "answer: $...$"), as
    Minerva-style prompts ask for it, else the number of its last "The answer is 18": read in
    the completion's tail only."""
    tail = max(0, len(text) - TAIL_CHARS)
    found = _last_match(_STATED_ANSWER_RE, text, len(text), tail)
    # dollars are money as often as math: "is $18. Then $5" states 18, not the math "18. Then "
    stated = None if found is None else (found["math"] or found["inline"] or "").strip()
    if stated and _looks_symbolic(stated):
        return stated
    found = _last_match(_ANSWER_NUMBER_RE, text, len(text), tail)
    if found is not None:
        return None if found["hedge"] else found["number"]  # "18 or 26" states no one answer
    found = _ANSWER_WORD_RE.search(text, tail)
    return None if found is None else found["word"]


def _final_math(text: str) -> str | None:
    """The math the completion's last sentence ends on (`The area is $9 \\pi$ square units.`;
    not "The largest $n$ is 34.", which states a number after it): its last `$...$` part, or the parts joined by "and"/"or"/","
    (`$n = 1$ and $n = -2$`), each read by `_math_answer`. Math that is money (`$400 + $60`)
    or prose is none."""
    tail = text[-TAIL_CHARS:].rstrip()
    boundaries = list(_SENTENCE_END_RE.finditer(tail))
    sentence = tail[boundaries[-1].end() :] if boundaries else tail
    parts = list(_INLINE_MATH_RE.finditer(sentence))
    if not parts or _STATES_NUMBER_RE.search(sentence, parts[-1].end()):
        return None  # "The largest $n$ is 34.": the sentence states a number after the math
    between = [sentence[a.end() : b.start()] for a, b in zip(parts, parts[1:], strict=False)]
    if not all(_JOINER_RE.fullmatch(gap) for gap in between):
        parts = parts[-1:]
    sides = [_math_answer(part.group(1)) for part in parts]
    return None if None in sides else ", ".join(sides)


def _math_answer(math_text: str) -> str | None:
    """What a piece of math states as its answer: the last side of a chain of equalities or
    of arithmetic (`(2+1)(2+1) = 9` is 9), a named variable kept (`x = 1 \\pm \\sqrt{19}`), an
    equation in variables whole (`x^2/16 + y^2/12 = 1/4`), the exact value before an
    approximation (`\\frac{\\sqrt3}{2} \\approx 0.866`) or the value a name approximates
    (`x \\approx 11`); None for what ends in an operator or reads as prose."""
    exact, *approximate = re.split(r"\\approx|≈", math_text)
    if approximate and _LHS_NAME_RE.fullmatch(exact.strip()):
        exact = approximate[-1]
    sides = _EQUALS_RE.split(exact)
    lhs = sides[0]
    named = len(sides) == 2 and _LHS_RE.match(exact)
    in_variables = len(sides) == 2 and re.search(r"[a-zA-Z]", _COMMAND_RE.sub("", lhs))
    in_variables = in_variables and re.search(r"[-+]", lhs.strip().lstrip("-+"))
    side = exact.strip() if named or in_variables else sides[-1].strip()
    if not side or not _looks_symbolic(side) or re.search(r"[-+*/=^_\\]\s*$", side):
        return None
    return side


def _whole_math(text: str) -> str | None:
    """A completion that is one short piece of math and nothing else (`\\frac{\\sqrt{505}}{7}`),
    whole: its last number would be a denominator or an exponent."""
    math_text = text.strip().strip("$").strip()
    words = re.search(r"[a-zA-Z]{2,}|[,;]", _COMMAND_RE.sub("", _ENVIRONMENT_RE.sub("", math_text)))
    if "\n" in math_text or not math_text or words or not _looks_symbolic(math_text):
        return None  # "11H = 88000, so H = 8000.": a sentence, not one piece of math
    return math_text if re.search(r"[\\^/()+*=]|\d\s*[a-zA-Z]", math_text) else None


def _last_number(text: str) -> str | None:
    """The last number of `text`; None when it ends a hedge between two (`4 or 3`)."""
    found = _last_match(_NUMBER_RE, text, len(text))
    if found is None or _HEDGE_RE.search(text, max(0, found.start() - 40), found.start()):
        return None
    return found.group()
