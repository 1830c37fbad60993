"""Answer matching against a reference (`answers_match`, `usable_gold`).

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
    expanded where it is factored, letters in a denominator the reference has not, a fraction
    unreduced, like terms uncollected, a power of a number, a function evaluated), that
    restates the prompt, its expression reordered or renotated too (`_restates`), chains
    equalities, names another variable, or lists one member twice (`\\{\\sqrt{2}, \\sqrt{2}\\}`,
    `\\pi, \\pi`: `_repeats_member`) where the reference does not;
  - `strict=False` (`reward.answer_match: lenient`) sends any pair that is not two equal numbers
    to math-verify and lets restated expressions match: the matching before strict existed.
Numbers are bounded before they are built (MAX_ANSWER_CHARS, MAX_EXPONENT:
`oncurve.rewards.normalization`), and math-verify sees only short answers and references without
huge powers, factorials of brackets, gamma, products or sums (`_tame`), each comparison bounded
by `oncurve.rewards.math` (TimeoutError past it).
"""

from __future__ import annotations

import collections
import math
import re
from fractions import Fraction

from oncurve.rewards.normalization import (
    BOX_RE,
    COMMAND_RE,
    EQUALS_RE,
    LHS_RE,
    MAX_ANSWER_CHARS,
    PERCENT_WORDS,
    SPACING_RE,
    TEXT_RE,
    changes_value,
    last_boxed,
    looks_symbolic,
    normalize_answer,
    stated,
    undress,
)

_PERCENT_PROMPT_RE = re.compile(r"percent|%", re.IGNORECASE)
# A question that asks for a percentage (not one that only mentions one: "a 30% chance of rain;
# what is the probability it does not rain?")
_PERCENT_ASKED_RE = re.compile(
    r"\b(?:what|which|how\s+many|how\s+much)\s+percent(?:age)?\b"
    r"|\b(?:what|which|find|give|express|as|the|determine)\b[^.?]{0,40}\bpercentage\b"
    r"|^\s*percentage\b|\bas\s+a\s+percent"
    r"|\bin\s+percent|\bpercent\s+(?:increase|decrease|change|error)\b|\bby\s+what\s+percent",
    re.IGNORECASE,
)
_INSTRUCTION_RE = re.compile(
    r"\s*(?:express|give|write|find|round|convert|answer|enter|state|compute|calculate"
    r"|determine|what|how|which)\b",
    re.IGNORECASE,
)
# A bracketed group without brackets inside (collapsed, innermost first, to count an answer's
# top-level parts)
_INNER_GROUP_RE = re.compile(r"\([^()]*\)|\[[^\[\]]*\]|\\\{[^{}]*\\\}")
_TEXT_COMMAND_RE = re.compile(r"\\(?:text|textnormal|mathrm|mbox)\b")
_TRAILING_UNITS_RE = re.compile(
    r"(?:\s|(?<!\\)\\ )*\\(?:text|textnormal|mathrm|mbox)\s*\{(?P<words>\s*[a-zA-Z][a-zA-Z ./-]*)\}"
    r"\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*\.?\s*$"
)
_CHOICE_RE = re.compile(r"\(?(?P<letter>[A-Ea-e])\)?")
_MALFORMED_GOLDS = frozenset(("nan", "none", "null", "n/a", "0/0"))
_OVER_ZERO_RE = re.compile(
    r"\\[dtc]?frac\s*\{[^{}]*\}\s*\{\s*0+\s*\}|(?<![\d.])\d+\s*/\s*0+(?![\d.])"
)
_ANSWER_PHRASE_RE = re.compile(
    r"\s*(?:(?:so|thus|therefore|hence),?\s+)?(?:the\s+)?(?:final\s+)?answer\s*(?:is|:|=)\s*"
    r"(?P<answer>.+?)\s*\.?\s*",
    re.IGNORECASE | re.DOTALL,
)
# A literal number of a prompt, for `_converts_back`: in scientific notation (`2.5 \times
# 10^3`), a mixed number, a fraction (LaTeX, a/b or a quotient `7 \div 8`, `7 divided by 8`),
# a decimal (repeating too: `0.\overline{36}`), a percentage or an integer.
_FRACTION_PART = r"\\[dtc]?frac\s*(?:\{\s*\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)"
_PROMPT_NUMBER_RE = re.compile(
    r"(?:\d*\.)?\d+\s*(?:\\times|×|\\cdot)\s*10\s*\^\s*(?:\{\s*[-−]?\d+\s*\}|[-−]?\d)"
    rf"|\d+\s*{_FRACTION_PART}|{_FRACTION_PART}"
    r"|\d+\s*(?:/|\\div|÷|divided\s+by)\s*\d+"
    r"|\d*\.\d*\\overline\s*(?:\{\s*\d+\s*\}|\d)|(?:\d*\.)?\d+\s*\\?%|\d*\.\d+|\d+",
    re.IGNORECASE,
)
_QUOTIENT_RE = re.compile(r"\s*(?:\\div|÷|divided\s+by)\s*", re.IGNORECASE)
# A prompt that asks for a number in another form than its own
_CONVERSION_RE = re.compile(
    r"\b(?:express(?:ed)?|convert(?:ed)?|write|written|rewrite|round(?:ed)?)\b"
    r"|\bas\s+an?\s+(?:common\s+|improper\s+|mixed\s+|reduced\s+)?"
    r"(?:fraction|decimal|percent(?:age)?|mixed\s+number|integer)\b"
    r"|\bin\s+(?:decimal|fraction(?:al)?|simplest|lowest|scientific)\b",
    re.IGNORECASE,
)
# `\pm 3`, `±3`: a list of two numbers
_PLUS_MINUS_RE = re.compile(r"(?:\\pm|±)\s*(?P<number>[^,;]+)")
_PLUS_MINUS_SIGN_RE = re.compile(r"\\(?:pm|mp)(?![a-zA-Z])|[±∓]")
# A set's braces (`\{2, 3\}`, `x \in \{2, 3\}`): its members are a list
_SET_RE = re.compile(r"(?:[a-zA-Z]\s*\\in\s*)?\\\{(?P<members>[^{}]*)\\\}")
_LIST_SEPARATOR_RE = re.compile(r"\s*(?:,(?!\d{3}(?!\d))|;|\bor\b|\band\b)\s*")
_DECIMAL_RE = re.compile(r"\d\.\d|(?<!\d)\.\d")
# A power that is a root: `^{1/2}`, `^{\frac{1}{3}}`, `^(1/2)`, `^{0.5}`, `^.5`
_FRACTIONAL_POWER_RE = re.compile(
    r"\^\s*[{(]?\s*(?:\\[dtc]?frac\s*\{?\s*\d+\s*\}?\s*\{?\s*\d+|\d+\s*/\s*\d+|\d*\.\d)"
)
_SQRT_RE = re.compile(r"\\sqrt(?:\s*\[\s*(?P<index>2)\s*\])?\s*|(?<![a-zA-Z\\])sqrt\s*")
# Brackets multiplied or raised: `(x+1)(x+1)`, `(1+x)^2`, `2(x+1)`, `(x+1) \cdot (x-1)`
_BRACKET_PRODUCT_RE = re.compile(r"\)\s*(?:\\cdot|\\times|\*)?\s*[(\^\da-zA-Z]|[\w}]\s*\(")
# Arithmetic between two written numbers (`5-3`, `1+1`, `6/2`, `2\cdot 2`; not an exponent's,
# a subscript's or a coefficient's number: `x^2+1`, `2+3x`, `1+2\sqrt{3}`), a factorial or a
# binomial coefficient of numbers (`0!`, `\binom{5}{0}`): work left undone, in a matrix's entry
# too (`2-1 \\`, `\\ 3-1\end`). A command's bare numeric argument (`\sqrt 3+1`) and subscripts are
# taken out first (`_without_arguments`).
_CONSTANT_ARITHMETIC_RE = re.compile(
    r"(?:(?<![\w.^_\\])|(?<=\\\\))\d+(?:\.\d+)?\s*"
    r"(?:[-+]\s*\d+(?:\.\d+)?(?![\w.^({]|\\(?!\\|end\b))"
    r"|(?:[*/]|\\cdot|\\times)\s*\d+(?:\.\d+)?(?![\w.^]))"
    r"|(?<![\w.^_])\d+\s*!|\\[dt]?binom\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}"
)
# A command's bare numeric argument (`\sqrt 3`, `\frac 3 4`, `\log 3`); not a constant's
# (`\pi 18`)
_COMMAND_NUMBER_RE = re.compile(
    r"\\(?:[dtc]?frac|sqrt|log|ln|lg|sin|cos|tan|sec|csc|cot|binom)(?![a-zA-Z])\s*\d"
)
_FRAC_RE = re.compile(r"\\[dtc]?frac\s*\{")
# A function to evaluate: an elementary one, `e^`, a maximum, a divisor, a determinant, a floor
# or an absolute value (`\max(1+\sqrt2, 1-\sqrt2)`, `|-2|\sqrt2`). Its name may have one letter
# glued to it, its argument's (`\lne`: `normalize_answer` takes out the space of `\ln e`), not
# two (`\lnot`).
_FUNCTION_RE = re.compile(
    r"\\(?:log|ln|lg|exp|sin|cos|tan|cot|sec|csc|arcsin|arccos|arctan|sinh|cosh|tanh|max|min"
    r"|gcd|lcm|det|lfloor|lceil|[lr]?vert|[lr]?Vert)(?![a-zA-Z]{2})"
    r"|(?<![a-zA-Z\\])e\s*\^|\|"
)
# An operation that changes nothing: times or over one (`\sqrt{2}\cdot 1`, `1 \cdot x`, `/1`,
# `\frac{x}{1}`), a coefficient one (`1\sqrt{2}`), a power one or zero (`x^{1}`, `\pi^0`), two
# signs (`--x`, `-(-x)`)
_IDENTITY_RE = re.compile(
    r"(?:\\cdot|\\times|\*|/)\s*1(?![\d.])"
    r"|(?<![\w.}{^_])1\s*(?:\\cdot|\\times|\*|\\sqrt|\\pi|[a-zA-Z](?![a-zA-Z]))"
    r"|\}\s*\{\s*1\s*\}"  # a fraction's denominator
    r"|\^\s*(?:[01]|\{\s*[01]\s*\}|\(\s*[01]\s*\))(?![\d.])"
    r"|[-+]\s*\(?\s*-"
)
_ROOT_PRODUCT_RE = re.compile(r"\\sqrt\s*(?:\{[^{}]*\}|\w)\s*(?:\\cdot|\\times|\*)?\s*\\sqrt")
_NUMBER_POWER_RE = re.compile(r"(?<![\w\\.^])\d+\s*\^")  # `3^2`: a power of a number
_LEADING_COEFFICIENT_RE = re.compile(r"\s*(\d+)")
# An equation's left side that is a value, not a name (subscripts taken out first: `x_1`)
_VALUE_RE = re.compile(r"\d|\\(?:sqrt|[dtc]?frac|pi|infty)(?![a-zA-Z])")
_SUBSCRIPT_RE = re.compile(r"_\s*(?:\{[^{}]*\}|\w)")
# What names a quantity on an equation's left side: letters, commands (`\angle ABC`), brackets
# and commas (`f(x)`, `(a, b)`), primes, a function's number argument (`f(2)`); no other digit
# nor an operator
_NAME_RE = re.compile(
    r"(?:[\sa-zA-Z\\{}(),']|\(\s*-?\d+(?:\.\d+)?\s*\))*[a-zA-Z]"
    r"(?:[\sa-zA-Z\\{}(),']|\(\s*-?\d+(?:\.\d+)?\s*\))*"
)
# Runs of digits split by spaces, and those that are one number in thousands (`10 000`)
_SPACED_DIGITS_RE = re.compile(r"\d+(?:\s+\d+)+")
# A LaTeX space between two digits (`4\,6`, `10\;000`): read as a space
_LATEX_DIGIT_SPACE_RE = re.compile(r"(?<=\d)\s*(?<!\\)\\[,;: ]\s*(?=\d)")
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:\s\d{3})+")
_OVER_RE = re.compile(r"\s*/")
# What `_restates` compares: commands, single digits, letters and operators; brackets, braces,
# `$` and multiplication signs only change how an expression looks.
_TOKEN_RE = re.compile(r"\\[a-zA-Z]+|[^\s{}()\[\]$*]")
_TIMES = frozenset(("\\cdot", "\\times"))
# An operation between terms, a power, a factorial, a command or a bracket: not a bare number
# or symbol (`-1` is not one).
_EXPRESSION_RE = re.compile(r".[-+*/^!]|\\[a-zA-Z]|\(")
_MATH_SEGMENT_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# Operators whose value sympy computes however large: factorials of brackets (`(x-x+9999999)!`,
# `(3!)!`), the gamma function, products and sums.
_UNBOUNDED_RE = re.compile(
    r"[)}\]]\s*!|\\(?:Gamma|prod|sum|operatorname\s*\{\s*[a-zA-Z]*\s*\})"
    r"|\\exp\s*[({]?\s*\\exp"  # an exponential of an exponential
)
MAX_RADICAND = 10**10
_EXPLOSIVE_RE = re.compile(
    r"\d{21,}"  # a number past any answer's size
    r"|\d{16,}"  # one whose reciprocal math-verify's evaluation chops to 0 (`\pi + 1/10^{17}`)
    r"|\d[eE][-+]?\d{4,}"  # 1e999999999
    r"|!\s*!"  # 9!!!: factorials of factorials
    r"|\d{4,}\s*!"  # 99999!
)


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
    if strict and (
        _chained(predicted)
        or _other_variable(predicted, gold)
        or _false_equation(predicted, gold)
        or _split_digits(predicted)
        or (_repeats_member(predicted) and not _repeats_member(gold))
    ):
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
    gold_stated = stated(gold)
    pred_stated = stated(predicted, reduced=strict)
    if gold_stated is not None and pred_stated is not None:
        if not _same_value(pred_stated, gold_stated, prompt):
            return False
        return not (strict and prompt and _converts_back(pred_stated, gold_stated, prompt))
    if strict and gold_stated is not None:
        return False
    if gold_stated is not None:
        if _number_list(predicted) is not None:
            return False  # a list (`32, 349`) is not the one number asked for, read as digits
        ref = str(gold_stated[0])
    gold_list = _number_list(gold)
    if gold_list is not None:
        pred_list = _number_list(predicted, reduced=strict)
        if pred_list is not None or strict:
            return pred_list is not None and sorted(pred_list) == sorted(gold_list)
    if not (looks_symbolic(pred) and looks_symbolic(ref) and _tame(pred) and _tame(ref)):
        return False
    if strict and _bracketed(ref) and not _a_pair(pred):
        return False  # a pair or an interval asked for, a set, a hedge or a list given
    if strict and prompt and _restates(pred, prompt, ref):
        return False
    pair = _MEMBER_OF_RE.sub("", pred)
    if strict and _bracketed(pair) and (pair[0], pair[-1]) == (ref[0], ref[-1]):
        parts, ref_parts = _pair_parts(pair), _pair_parts(ref)
        if len(parts) == len(ref_parts):  # each part paid as an answer: `(1, 4.5)`, `(1, 9/2)`
            try:
                return all(
                    answers_match(p, r, strict=True) for p, r in zip(parts, ref_parts, strict=True)
                )
            except RuntimeError:
                pass  # a part math-verify cannot compare alone (`+\\infty`): the pair is, whole
    if strict and _undone(pred, ref):
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
    parts = _LIST_SEPARATOR_RE.split(TEXT_RE.sub(r" \1 ", text))
    return any(len(EQUALS_RE.findall(part)) > 1 for part in parts)


def _false_equation(predicted: str, gold: str) -> bool:
    """Whether the answer holds an equation that states no value of a name: its left side a
    value (`1 = 2\\sqrt{3}`, `\\sqrt{3} = \\sqrt{2}`), any equation where the reference is a
    choice's letter (`B = C`), or equations among more parts than the reference has (`x =
    3\\sqrt{2} \\text{ or } x = 2\\sqrt{3}`: one of them at least is not the answer)."""
    if len(predicted) > MAX_ANSWER_CHARS or not EQUALS_RE.search(predicted):
        return False
    if _CHOICE_RE.fullmatch(normalize_answer(gold)):
        return True
    parts = _top_level_parts(predicted)
    gold_parts = max(len(_top_level_parts(gold)), len(_LIST_SEPARATOR_RE.split(gold)))
    if re.search(r"\\pm|±", gold):  # `\pm 1` is two answers, `x = 1, x = -1`
        gold_parts *= 2
    if len(parts) > gold_parts:
        return True
    equation = EQUALS_RE.search(gold) is not None
    for part in _LIST_SEPARATOR_RE.split(TEXT_RE.sub(r" \1 ", predicted)):
        sides = EQUALS_RE.split(part)
        if len(sides) < 2:
            continue
        left = _SUBSCRIPT_RE.sub("", sides[0])
        # a left side with a letter may be the gold equation's own (`2x + y = 5`); where the
        # gold is a value, only a name (`x`, `AB`, `f(x)`, `f(2)`, `P(A)`, `\theta`, `(a, b)`)
        # stands there: `2x = 2\sqrt{3}` or `1 \text{ cm} = 2\sqrt{3}` states another value
        named = re.search(r"[a-zA-Z]", COMMAND_RE.sub("", left))
        if not named and _VALUE_RE.search(left):
            return True
        if not equation and not _NAME_RE.fullmatch(left):
            return True
    return False


# A set's braces, "or" between parts (normalised: `3or4`) or a plus-or-minus: no pair nor
# interval
_UNORDERED_RE = re.compile(r"^\\\{|(?<![a-zA-Z])or(?![a-zA-Z])|\\pm|±")
_MEMBER_OF_RE = re.compile(r"^[a-zA-Z]\\in")


def _a_pair(pred: str) -> bool:
    """Whether the normalised answer `pred` may state a pair or an interval: in brackets (after
    `x \\in`), or as named values (`x=1,y=3`); not a set, a hedge, a plus-or-minus or a bare
    list (`1,3`)."""
    if _UNORDERED_RE.search(pred):
        return False
    return _bracketed(_MEMBER_OF_RE.sub("", pred)) or "=" in pred


def _bracketed(text: str) -> bool:
    """Whether normalised `text` is one bracketed group with a comma at its top: an ordered
    pair, a point or an interval (`(3,4)`, `[3,4)`), not a list nor a set (`3,4`, `\\{3,4\\}`)."""
    if len(text) < 5 or text[0] not in "([" or text[-1] not in ")]":
        return False
    depth, comma = 0, False
    for k, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth == 0 and k < len(text) - 1:
                return False  # `(a,b)=(2,3)`: the first group closes before the end
        elif char == "," and depth == 1:
            comma = True
    return comma and depth == 0


def _pair_parts(text: str) -> list[str]:
    """The parts of a pair or an interval (`_bracketed`) at its top commas: `(1,\\frac{9}{2})`
    gives `1` and `\\frac{9}{2}`."""
    parts, depth, start = [], 0, 1
    for k, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 1:
            parts.append(text[start:k])
            start = k + 1
    return [*parts, text[start:-1]]


def _top_level_parts(text: str) -> list[str]:
    """The parts of `text` joined by commas, "or", "and" outside brackets (`(a, b) = (2, 3)` is
    one part)."""
    text = TEXT_RE.sub(r" \1 ", text)
    for _ in range(8):  # nested brackets, innermost first
        collapsed = _INNER_GROUP_RE.sub("()", text)
        if collapsed == text:
            break
        text = collapsed
    return _LIST_SEPARATOR_RE.split(text)


def _repeats_member(text: str) -> bool:
    """Whether a list or a set (`\\{...\\}`) that `text` states names one member twice, as
    written but for spacing and braces (`\\pi, \\pi`, `\\{\\sqrt2, \\sqrt{2}, 1\\}`,
    `\\sqrt{2} \\text{ or } \\sqrt{2}`): the same answer given twice is no simplified one. Only
    the top level is read: a pair's or an interval's equal parts (`(1, 1)`) are no repeat, nor
    are a number's thousands (`11,\\! 111,\\! 100`)."""
    if len(text) > MAX_ANSWER_CHARS:
        return False
    if BOX_RE.search(text):
        text = last_boxed(text) or text
    if stated(text) is not None:
        return False
    text = SPACING_RE.sub("", TEXT_RE.sub(r" \1 ", text)).strip().strip("$").strip()
    text = re.sub(r"^[a-zA-Z]\s*\\in\s*", "", text)  # `x \in \{1, 2\}`: the set
    depths, depth = [], 0
    for char in text:
        depth += (char in "([{") - (char in ")]}")
        depths.append(depth)
    if text.startswith("\\{") and text.endswith("\\}") and 0 not in depths[1:-1]:
        return _repeats_member(text[2:-2])  # a set's members
    parts, start = [], 0
    for separator in _LIST_SEPARATOR_RE.finditer(text):
        if separator.start() > 0 and depths[separator.start() - 1] == 0:
            parts.append(text[start : separator.start()])
            start = separator.end()
    parts.append(text[start:])
    seen = [_canonical(part) for part in parts]
    return len(set(seen)) < len(seen)


def _split_digits(text: str) -> bool:
    """Whether digits of `text` are split by a space, a LaTeX one too (`\\,`, `\\;`, `\\ `),
    that is no thousands separator (`1 8`, `4\\,6`, `10 00`; `10 000` and `10\\,000` are one
    number, `1 1/2` a mixed number)."""
    if len(text) > MAX_ANSWER_CHARS:
        return False
    text = _LATEX_DIGIT_SPACE_RE.sub(" ", _without_arguments(text))
    return any(
        not _THOUSANDS_RE.fullmatch(run[0])
        and not (len(run[0].split()) == 2 and _OVER_RE.match(text, run.end()))  # `1 1/2`
        for run in _SPACED_DIGITS_RE.finditer(text)
    )


def _without_units(text: str) -> str:
    """`text` without units in `\\text{}` after it (`9\\pi \\text{ cm}^2`), words that change
    or deny the value (`\\text{ thousand}`, `\\text{ is not it}`, `\\text{ x}`) kept, and a
    `\\text{}` that is the whole answer (`\\text{B}`, `\\mathrm{East}`) too."""
    if len(text) > MAX_ANSWER_CHARS:
        return text
    match = _TRAILING_UNITS_RE.search(text)
    if match is None or not text[: match.start()].strip():  # `\text{B}` is the answer itself
        return text
    words = re.split(r"[ ./-]+", match["words"].lower().strip())
    if changes_value(match["words"]) or " ".join(words) in PERCENT_WORDS:  # `18\text{ percent}`
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
    if len(predicted) > MAX_ANSWER_CHARS:
        return False
    named = [LHS_RE.match(undress(text)) for text in (predicted, gold)]
    return all(named) and named[0]["name"] != named[1]["name"]


def _same_value(
    pred: tuple[Fraction, bool, str], gold: tuple[Fraction, bool, str], prompt: str | None
) -> bool:
    """Whether two stated numbers agree, a percentage read as such: `75%` is 0.75, and is 75
    only where the question asks for a percentage (or the gold writes one)."""
    (value, percent, _), (gold_value, gold_percent, _) = pred, gold
    if percent == gold_percent:
        return value == gold_value
    if percent:  # `50%` is 50 where a percentage is asked (never 5000% for 50), else 0.5
        if prompt is None:
            return value / 100 == gold_value or value == gold_value
        if any(_PERCENT_ASKED_RE.search(ask) for ask in _requests(prompt)):
            return value == gold_value
        return value / 100 == gold_value
    return value in (gold_value, gold_value / 100)


def _requests(prompt: str) -> list[str]:
    """The sentences of `prompt` that ask for something: questions and instructions (`Express
    your answer as a percentage.`), not what it states (`The results are given as a
    percentage.`)."""
    sentences = re.split(r"(?<=[.!?])\s+", prompt.strip()[-4 * MAX_ANSWER_CHARS :])
    asked = [s for s in sentences if s.endswith("?") or _INSTRUCTION_RE.match(s)]
    return asked + sentences[-1:]  # the last, a question without its mark too


def _converts_back(
    pred: tuple[Fraction, bool, str], gold: tuple[Fraction, bool, str], prompt: str
) -> bool:
    """Whether the answer is the prompt's own number in another form than the gold's, where the
    prompt asks for a conversion: 0.75 or 75% for "Express 0.75 as a common fraction",
    `\\frac{7}{8}` for "Express $7 \\div 8$ as a decimal" (not 30% for "Which discount, in
    percent, is larger?", which asks for none). A percentage is a form of its own, its value
    over 100."""
    if _form(pred) == _form(gold) or not _CONVERSION_RE.search(prompt[: 4 * MAX_ANSWER_CHARS]):
        return False
    literals = set()
    for match in _PROMPT_NUMBER_RE.finditer(prompt[: 4 * MAX_ANSWER_CHARS]):
        text = _QUOTIENT_RE.sub("/", match.group()).replace("×", "\\times")
        literal = stated(re.sub(r"\\overline\s*(\d)", r"\\overline{\1}", text))
        if literal is not None:
            literals.add(_form(literal)[0])
    return _form(pred)[0] in literals


def _form(number: tuple[Fraction, bool, str]) -> tuple[Fraction, str]:
    """(value, form) of a stated number: a percentage's value is over 100, its form "percent"."""
    value, percent, kind = number
    return (value / 100, "percent") if percent else (value, kind)


def _number_list(text: str, *, reduced: bool = False) -> list[Fraction] | None:
    """The numbers of a bare list of two or more (`2, 3`; `x=2 \\text{ or } x=3`; `\\pm 3`; a
    set, `\\{2, 3\\}`), or None."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    text = TEXT_RE.sub(r" \1 ", text.strip())
    if BOX_RE.search(text):
        text = last_boxed(text) or text
    text = text.strip().strip("$").strip()
    members = _SET_RE.fullmatch(text)
    if members is not None:  # a set of solutions: its members
        text = members["members"].strip()
    plus_minus = _PLUS_MINUS_RE.fullmatch(text)
    if plus_minus is not None:
        value = stated(plus_minus["number"], reduced=reduced)
        return None if value is None or value[1] else [value[0], -value[0]]
    if not text or text[0] in "([{" or "\\{" in text:  # a tuple or an interval
        return None
    parts = _LIST_SEPARATOR_RE.split(text)
    if len(parts) < 2:
        return None
    values = [stated(part, reduced=reduced) for part in parts]
    if any(v is None or v[1] for v in values):
        return None
    return [v[0] for v in values]


def _undone(pred: str, ref: str) -> bool:
    """Whether the normalised answer `pred` still shows work the reference `ref` has done: a
    decimal for an exact reference, a root written as a power or with index 2, a root of a
    number that is not square-free or of arithmetic, a product or power of brackets where the reference has none, a sum where the reference is a
    product or power of brackets, a fraction with letters in its denominator where the
    reference has none, a fraction whose numerator's coefficients share a factor with its
    denominator (`\\frac{4\\sqrt{3}}{2}`), like terms not collected (`\\sqrt{3}+\\sqrt{3}`,
    `x+0`, `x \\pm 0`), an operation that changes nothing (`x \\cdot 1`, `x^{1}`, `--x`), a
    power of a number (`3^2\\pi`), roots multiplied
    (`\\sqrt{2}\\sqrt{6}`), or a function where the reference holds none (`x+\\log_2 2`,
    `x+e^0`, `\\max(a, b)`, `|-2|`; `\\tan^2 y+1` for
    `\\sec^2 y` is another form, not work undone)."""
    checks = (
        _unreduced_fraction,
        _like_terms,
        _constant_arithmetic,
        _NUMBER_POWER_RE.search,
        _ROOT_PRODUCT_RE.search,
        _IDENTITY_RE.search,
    )
    for undone in checks:
        if undone(pred) and not undone(ref):
            return True
    if _FUNCTION_RE.search(pred) and not _FUNCTION_RE.search(ref):
        return True
    if _DECIMAL_RE.search(pred) and not _DECIMAL_RE.search(ref):
        return True
    if _FRACTIONAL_POWER_RE.search(pred) and not _FRACTIONAL_POWER_RE.search(ref):
        return True
    for radicand in _radicands(pred):
        if radicand in _radicands(ref):
            continue
        if not radicand.isdecimal() or not _square_free(int(radicand)):
            return True
    if _bracket_product(pred) and "(" not in ref:
        return True
    if _bracket_product(ref) and "(" not in pred:  # expanded, where a factored form is asked
        return True
    if _letter_denominator(pred) and not _letter_denominator(ref):
        return True
    return _root_denominator(pred) and not _root_denominator(ref)  # not rationalised


def _constant_arithmetic(text: str) -> bool:
    """Whether `text` leaves arithmetic on written numbers undone (`_CONSTANT_ARITHMETIC_RE`)."""
    return _CONSTANT_ARITHMETIC_RE.search(_without_arguments(text)) is not None


def _without_arguments(text: str) -> str:
    """`text` without the numbers that are no number of its own: subscripts and commands' bare
    arguments (`\\log_2 3 + 1`, `\\frac 3 4`, `\\sqrt 3+1`)."""
    return _COMMAND_NUMBER_RE.sub(" C", _SUBSCRIPT_RE.sub("", text))


def _unreduced_fraction(text: str) -> bool:
    """Whether a fraction of `text` with a whole-number denominator shares a factor with every
    coefficient of its numerator's terms (`\\frac{4\\sqrt{3}}{2}`, `\\frac{12+18i}{2}`; not
    `\\frac{2+\\sqrt{2}}{4}`)."""
    for match in _FRAC_RE.finditer(text):
        numerator_end = _closing(text, match.end() - 1)
        if numerator_end is None or not text.startswith("{", numerator_end + 1):
            continue
        denominator_end = _closing(text, numerator_end + 1)
        denominator = text[numerator_end + 2 : denominator_end].strip()
        if not denominator.isdecimal():
            continue
        terms = _terms(text[match.end() : numerator_end])
        coefficients = [_coefficient(term)[0] for term in terms]
        if terms and math.gcd(int(denominator), *coefficients) > 1:
            return True
    return False


def _like_terms(text: str) -> bool:
    """Whether two terms of the sum `text` differ only in their whole-number coefficient
    (`3\\sqrt3-\\sqrt3`, `x^2+x+x+1`, two constants), or a term is zero."""
    if "=" in text or "," in text:
        return False
    rests = [_coefficient(term) for term in _terms(text)]
    if len(rests) > 1 and any(coefficient == 0 and not rest for coefficient, rest in rests):
        return True
    return len({rest for _, rest in rests}) < len(rests)


def _terms(text: str) -> list[str]:
    """The terms of `text` split at its top-level `+`, `-` and `\\pm` (not inside brackets,
    braces or an exponent), signs dropped, empty ones left out: `\\pi \\pm 0` has a zero term."""
    text = _PLUS_MINUS_SIGN_RE.sub("+", text)
    terms, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += (char in "({[") - (char in ")}]")
        if depth == 0 and char in "+-" and (index == 0 or text[index - 1] not in "^_"):
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return [term.strip() for term in terms if term.strip()]


def _coefficient(term: str) -> tuple[int, str]:
    """(the term's leading whole-number coefficient, 1 without one; the rest)."""
    match = _LEADING_COEFFICIENT_RE.match(term)
    if match is None:
        return 1, term.strip()
    return int(match[1]), re.sub(r"^\s*(?:\\cdot|\\times|\*)", "", term[match.end() :]).strip()


def _bracket_product(text: str) -> bool:
    """Whether brackets are multiplied or raised in `text` (a function's own, `\\sin(x)`, are
    not)."""
    return _BRACKET_PRODUCT_RE.search(COMMAND_RE.sub(" ", text)) is not None


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
    """Whether `n` has no square factor; False past `MAX_RADICAND` (a root of a number that
    large is no simplified answer, and trial division would take the caller's thread
    minutes)."""
    if n < 2 or n > MAX_RADICAND:
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
        re.search(r"[a-zA-Z]", COMMAND_RE.sub("", denominator))
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
    tokens = _tokens(pred)
    reordered_reference = tokens == _tokens(ref)  # the reference's own form, reordered
    for match in _MATH_SEGMENT_RE.finditer(prompt):
        written = next(group for group in match.groups() if group is not None)
        segment = _canonical(written)
        if not _EXPRESSION_RE.search(segment):
            continue
        if segment in answer and segment not in reference:
            return True
        if not reordered_reference and tokens == _tokens(written):  # reordered, renotated
            return True
    return False


def _tokens(text: str) -> collections.Counter[str]:
    """The tokens of `text` as a multiset (`_TOKEN_RE`; a fraction as `/`), whatever their
    order: `\\pi + \\log_2 8` has those of `\\log_2 8 + \\pi`, `\\cos(\\pi/6)` those of
    `\\cos\\frac{\\pi}{6}`."""
    text = re.sub(r"\\[dtc]?frac(?![a-zA-Z])", "/", SPACING_RE.sub("", text))
    return collections.Counter(t for t in _TOKEN_RE.findall(text) if t not in _TIMES)


def _canonical(text: str) -> str:
    """`text` as `_restates` compares it: without what only changes how an expression looks
    (whitespace, braces, `$`, spacing and sizing commands, `\\dfrac` for `\\frac`)."""
    return re.sub(r"[\s{}$]|(?<=\\)[dt](?=frac)", "", SPACING_RE.sub("", text))


def _tame(text: str) -> bool:
    """Safe to hand to math-verify: no number that sympy would build in C, past any timeout's
    reach and with gigabytes of memory (a tower `9^{9^{9^{9}}}`, `9!!!`, `1e999999999`, a
    binomial of powers), whatever letters dress it (`(x-x+9999999)!` cancels to a number): no
    factorial of a bracket, no gamma function, product or sum operator, no exponential of an
    exponential, no power, product or exponential inside an exponent. Applied to the reference
    too. `text` is short (`looks_symbolic`)."""
    if _EXPLOSIVE_RE.search(text) or _UNBOUNDED_RE.search(text):
        return False
    if re.search(r"\\(?:[dt]?binom|choose)", text) and re.search(r"\^|\d{4,}", text):
        return False
    return all(
        not re.search(r"\d{4,}|[\^!*]|\\(?:cdot|times|exp)", exponent)
        for exponent in _exponents(text)
    )


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
