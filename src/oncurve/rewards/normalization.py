"""What extraction and matching both read in an answer: the content of its last box
(`last_boxed`), the dressing around a stated number (`undress`), the number it states
(`stated_number`, `stated`), its canonical surface form (`normalize_answer`), and whether it is
short math worth a symbolic comparison (`looks_symbolic`); with the patterns both use for LaTeX
commands, `\\text{}`, spacing, equalities and a leading `x =`. Numbers are bounded before they
are built (MAX_ANSWER_CHARS, MAX_EXPONENT).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# A stated answer is at most this long, so no digit run reaches Python's 4,300-digit int limit.
MAX_ANSWER_CHARS = 1000
MAX_EXPONENT = 1000  # `1e999999999` would build a billion-digit integer
MAX_SYMBOLIC_CHARS = 100
BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
# A box opener with the brace of its argument (group 1) or its unbraced argument (group 2,
# `\boxed 7`), or any other brace: one pass over these finds every box (`last_boxed`).
_BOX_TOKEN_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])(?:[ \t]*(\{)|[ \t]+([^\s${}\\]+))?|[{}]")
_NON_SPACE_RE = re.compile(r"\S")

TEXT_RE = re.compile(
    r"\\(?:text|textbf|textrm|textit|textnormal|textup|mathrm|mathbf|mathit|mathsf|mbox|bm"
    r"|boldsymbol|underline)\s*\{([^{}]*)\}"
)
# A spacing command's backslash is not the second of a row break `\\\\` (`\\\\ 2` keeps its row).
SPACING_RE = re.compile(r"\\left|\\right|\\displaystyle|(?<!\\)\\[,;:! ]")
_WRAPPERS = (("**", "**"), ("__", "__"), ("*", "*"), ("`", "`"), ("$$", "$$"), ("$", "$"))
_WRAPPERS += (("\\(", "\\)"), ("\\[", "\\]"), ("(", ")"), ("{", "}"))
_STATED_RE = re.compile(
    r"""(?:(?P<name>[a-zA-Z]{1,12}(?:_\{?[a-zA-Z0-9]+\}?)?|[a-zA-Z]{1,3}\(\s*-?\d+(?:\.\d+)?\s*\)
           |\\(?!not(?![a-zA-Z]))[a-zA-Z]+)\s*=
        |\\approx|≈|=)?\s*
    (?P<sign>[-+]?)\s*(?:\$|€|£|¥|₹|₩|₽)?\s*(?P<sign2>[-+]?)\s*
    (?:
        (?:(?P<mixed>\d+)\s*)?
        \\frac\s*(?:\{\s*(?P<fnum>-?\d+)\s*\}|(?P<fnum1>\d))
                \s*(?:\{\s*(?P<fden>-?\d+)\s*\}|(?P<fden1>\d))
      | (?:(?P<mixed2>\d+)\s+)?(?P<rnum>\d+)\s*/\s*(?P<rden>\d+)
      | (?P<whole>\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))
        (?:\.(?P<decimals>\d*)(?:\\(?:overline|bar)\s*\{\s*(?P<repeat>\d+)\s*\})?)?
        (?:[eE](?P<exp>[-+]?\d+)
          |\s*(?:\\times|\\cdot|×|·)\s*10\s*\^\s*(?:\{\s*(?P<exp2>[-+]?\d+)\s*\}|(?P<exp1>\d)))?
    )
    \s*(?P<percent>%)?(?:(?:\^\s*\{?\s*\\circ\s*\}?|\\circ|°)(?:\s*[CFK](?![a-zA-Z]))?)?
    (?:\s*(?P<scale>thousand|million|billion|trillion)\b)?
    (?P<words>(?:\s+|(?=[a-zA-Z]{2}))[a-zA-Z]+(?:[ /-]+[a-zA-Z]+){0,3}(?:\^\{?\d\}?)?)?
    \s*\.?""",
    re.VERBOSE,
)
# Words after a number that scale it: `70 thousand`, `$1.45 million`.
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
# Words after a number that change its value or deny it: `5 squared`, `5 is not the answer`.
NOT_UNITS = frozenset(
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
        "bn",
        "bln",
        "mn",
        "mln",
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
        "tenth",
        "tenths",
        "hundredth",
        "hundredths",
        "thousandth",
        "thousandths",
        "k",
        "grand",
        "lakh",
        "lakhs",
        "crore",
        "crores",
        "factorial",
        "doubled",
        "tripled",
        "halved",
        "halves",
        "divided",
        "quartered",
        "reciprocal",
        "inverse",
        "below",
        "above",
        "least",
        "most",
        "wrong",
        "incorrect",
        "negative",
        "negatives",
        "millionth",
        "millionths",
        "billionth",
        "billionths",
        "trillionth",
        "trillionths",
        "tens",
        "score",
        "scores",
        "gross",
        "twice",
        "thrice",
        "more",
        "fewer",
        "less",
        "basis",
        "pi",
        "tau",
        "phi",
    ]
)
PERCENT_WORDS = frozenset(("percent", "per cent", "percentage points", "pct"))
# Letters that are units after a number (`12.5 m`, `5 s`, `3 A`); another letter is a variable
# or a constant (`4 x`, `4 i`, `4 e`): a product, not a unit
UNIT_LETTERS = frozenset("mgslLhAVWJNCFKT")
# Dashes and signs a completion may write for a minus or a percent
SIGNS = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2212\ufe63\uff0d\u2796\u02d7", "-"),
        **dict.fromkeys("\uff05\ufe6a", "%"),
    }
)

COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
ENVIRONMENT_RE = re.compile(r"\\(?:begin|end)\s*\{[a-zA-Z*]+\}")
EQUALS_RE = re.compile(r"(?<![<>!\\])(?<!\\not)(?<!\\not )=")
LHS_RE = re.compile(r"\s*(?P<name>[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?)\s*=(?!=)")


def normalize_answer(text: str) -> str:
    """Canonical surface form: a boxed answer unwrapped, no whitespace, `$`, trailing period,
    `\\text{}` wrapper, `\\left`/`\\right`, degree or percent sign, or leading `x =`;
    `\\varnothing` as `\\emptyset`."""
    text = text.strip()
    if BOX_RE.search(text):
        text = last_boxed(text) or text
    text = SPACING_RE.sub("", TEXT_RE.sub(r"\1", text))
    text = re.sub(r"\^\{?\\circ\}?|\\%|%", "", text)
    text = text.replace("\\$", "").replace("$", "")
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"^[a-zA-Z]=(?!=)", "", text)
    text = re.sub(r"\\varnothing(?![a-zA-Z])", r"\\emptyset", text)
    return text.rstrip(".")


def stated_number(text: str, *, reduced: bool = False) -> Fraction | None:
    """The value of `text` when it states one number: an integer, a decimal (`1e3`,
    `1.5 \\times 10^3`, `0.\\overline{3}`, `0.\\bar{3}` too), a fraction (`3/4`, `\\frac{3}{4}`,
    `\\dfrac34`, `\\frac{2}{-3}`) or a mixed number (`7\\frac{1}{2}`), with its dressing: sign,
    thousands separators (`1,000`, `1{,}000`, `1\\,000`), a currency sign, `%`, degrees, units
    in words or `\\text{}` (`72 apples`, `5\\text{ hours}`, `18\\text{ m}^2`), a leading `x =`,
    `AB =`, `Total =`, `f(2) =`, `x_1 =` or `\\approx`, markdown emphasis, math delimiters,
    brackets, a box, a trailing period.
    A percentage's value is the number as written (`answers_match` reads the `%`). With
    `reduced`, a fraction counts only in lowest terms with a denominator above 1 (`\\frac{58}{2}`
    is arithmetic left undone). None for anything else: words that change the value or deny it
    (`5 thousand`, `5 is not the answer`), an answer longer than MAX_ANSWER_CHARS or an exponent
    beyond MAX_EXPONENT."""
    found = stated(text, reduced=reduced)
    return None if found is None else found[0]


def stated(text: str, *, reduced: bool = False) -> tuple[Fraction, bool, str] | None:
    """(value, whether it is a percentage, its kind: "integer", "decimal", "scientific" (`2.5
    \\times 10^3`, `1e3`), "fraction" or "mixed" (`2\\frac{1}{2}`)) of the number `text` states
    (`stated_number`)."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    match = _STATED_RE.fullmatch(undress(text))
    if match is None or (match["sign"] and match["sign2"]):
        return None
    # a word that denies the value names it (`wrong = 4`); one letter is a variable (`k = 4`)
    if match["name"] and len(match["name"]) > 1 and match["name"].lower() in NOT_UNITS:
        return None
    words = (match["words"] or "").strip().lower()
    if changes_value(match["words"] or ""):
        return None
    percent = bool(match["percent"]) or words in PERCENT_WORDS
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
        mixed = match["mixed"] or match["mixed2"]
        if mixed is not None:
            if not 0 < value < 1:  # `7\frac{1}{2}` is seven and a half; `7\frac{3}{2}` is not
                return None
            value += int(mixed)
            return sign * value, percent, "mixed"
        return sign * value, percent, "fraction"
    decimals = match["decimals"] or ""
    exponent = int(match["exp"] or match["exp2"] or match["exp1"] or 0) - len(decimals)
    if abs(exponent) > MAX_EXPONENT:
        return None
    digits = (match["whole"].replace(",", "") + decimals) or "0"
    value = Fraction(int(digits))
    if match["repeat"]:  # 0.1\overline{6}: the repeated digits add digits / (10^k - 1)
        if reduced and set(match["repeat"]) == {"9"}:  # 17.\overline{9}: 18 left unwritten
            return None
        value += Fraction(int(match["repeat"]), 10 ** len(match["repeat"]) - 1)
    kind = "decimal" if match["decimals"] is not None or exponent < 0 else "integer"
    if match["exp"] or match["exp2"] or match["exp1"]:
        kind = "scientific"
        if reduced and not 1 <= int(digits) / 10 ** len(decimals) < 10:
            return None  # `1800 \times 10^{-2}`: a mantissa outside [1, 10) is work undone
    scale = _SCALES[match["scale"].lower()] if match["scale"] else 1
    return sign * value * Fraction(10) ** exponent * scale, percent, kind


def changes_value(words: str) -> bool:
    """Whether `words` after a number change or deny its value: a word of NOT_UNITS, or a
    single letter first that is no unit (`4 x`, `4 i`; not `12 m`, nor `5 a day`)."""
    split = [word for word in re.split(r"[ ./-]+", words.strip()) if word]
    if not split:
        return False
    if NOT_UNITS.intersection(word.lower() for word in split):
        return True
    first = split[0]
    return len(first) == 1 and first not in UNIT_LETTERS and not (first == "a" and split[1:])


def undress(text: str) -> str:
    """`text` without what surrounds a stated number: a box, `\\text{}` (its words kept as
    words), spacing commands, math delimiters, markdown emphasis; `\\dfrac` as `\\frac`."""
    text = text.strip().translate(SIGNS)
    if BOX_RE.search(text):
        text = last_boxed(text) or text
    text = TEXT_RE.sub(r" \1 ", TEXT_RE.sub(r" \1 ", text))  # `\bm{\text{18}}`
    text = re.sub(r",\s*\\[!,]\s*", ",", text)  # `32,\! 349`
    text = SPACING_RE.sub("", re.sub(r"(?<!\\)\\ ", " ", text)).replace("~", " ")
    for old, new in (("{,}", ","), ("\\$", "$"), ("\\%", "%")):
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
    return _INLINE_NUMBER_RE.sub(r"\1", text)  # `$125$ miles`: the unit outside the math


# A number in inline math at the start, its unit in words after it
_INLINE_NUMBER_RE = re.compile(r"^\$([^$]{1,40})\$(?=\s+[a-zA-Z])")


def looks_symbolic(text: str) -> bool:
    """Worth a symbolic comparison: short, and no words outside LaTeX commands. Prose costs
    math-verify tens of milliseconds per row and never matches."""
    words = COMMAND_RE.sub("", ENVIRONMENT_RE.sub("", text))  # `\\begin{pmatrix}` is no prose
    return len(text) <= MAX_SYMBOLIC_CHARS and not re.search(r"[a-zA-Z]{4,}", words)


def last_boxed(text: str) -> str | None:
    """Content of the last outermost `\\boxed{...}`, braces balanced (`\\boxed{\\frac{1}{2}}`);
    a box that only wraps another box is unwrapped. One pass over the braces: each box's
    argument ends where its brace closes, so nested or unclosed boxes cost no rescans."""
    first = BOX_RE.search(text)
    if first is None:
        return None
    # offsets in dicts of ints, not tuples: a text of thousands of boxes would make as many
    # objects the garbage collector tracks, and set it off
    content_starts: dict[int, int] = {}  # box start -> where its content starts
    content_ends: dict[int, int] = {}  # box start -> where its content ends
    box_ends: dict[int, int] = {}  # box start -> where the box ends
    last = None  # the box that closed last: it is outermost, since one around it closes later
    open_braces: list[int] = []  # per open brace: its box's start, or -1 (a plain brace)
    for token in _BOX_TOKEN_RE.finditer(text, first.start()):  # braces before it hold no box
        if token.group() == "{":
            open_braces.append(-1)
        elif token.group() == "}":
            box = open_braces.pop() if open_braces else -1
            if box >= 0:
                content_ends[box], box_ends[box] = token.start(), token.end()
                # an empty box (a prompt's `\boxed{}` quoted) is no answer: the one before
                # it still is
                if _NON_SPACE_RE.search(text, content_starts[box], token.start()):
                    last = box
        elif token.group(1):
            open_braces.append(token.start())
            content_starts[token.start()] = token.end()
        elif token.group(2):
            end = token.start(2) + len(token.group(2).rstrip("."))  # `\boxed 7.`
            content_starts[token.start()] = token.start(2)
            content_ends[token.start()], box_ends[token.start()] = end, token.end()
            last = token.start()
    if last is None:
        return None
    start, end = content_starts[last], content_ends[last]
    while True:
        first = _NON_SPACE_RE.search(text, start, end)
        if first is None or first.start() not in box_ends:
            break
        stop = end
        while stop > box_ends[first.start()] and text[stop - 1].isspace():
            stop -= 1
        if stop != box_ends[first.start()]:
            break
        start, end = content_starts[first.start()], content_ends[first.start()]
    return text[start:end].strip()
