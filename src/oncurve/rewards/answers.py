"""Answer extraction from completions and answer matching against a reference.

Extraction styles (`extract_answer`), each linear in the completion's length:
  tags         the last `<answer>...</answer>`: the last closing tag and the nearest opening tag
               before it
  boxed        the last outermost `\\boxed{...}` (or `\\fbox{...}`), nested braces balanced; a box
               that only wraps another box is unwrapped
  gsm8k        the text after the last `####` whose line states a number (`stated_number`), of
               the last GSM8K_LINES such lines, so a markdown heading such as `#### Step 2` is
               not taken for the answer
  last_number  the last number: `-12`, `1,000`, `3.5`, `3/4`
  auto         the first of tags, boxed, gsm8k, last_number that finds something; inside
               `<answer>` a `\\boxed{}` is unwrapped

Matching (`answers_match`; README, "What `correct` pays for"):
  - the reference's own surface form (after `normalize_answer`) always matches;
  - a reference that states a number (`stated_number`: `72`, `-1,000.5`, `\\frac{3}{4}`,
    `12\\text{ inches}`) is matched by a stated number of the same value, and by nothing else
    when `strict` (the default): an integer, a decimal or a reduced fraction, with its dressing
    (sign, thousands separators, `$`, `%`, units in words, a leading `x =` or `\\approx`,
    markdown emphasis). `25+4`, `2^{10}`, `\\binom{8}{4}`, `\\frac{58}{2}` are not answers,
    whatever they equal: a policy paid for them learns to copy the question;
  - any other reference (`\\frac{\\sqrt{2}}{2}`, `(x+1)^2`) is compared symbolically through
    math-verify (extra `math`), except, when `strict`, an answer that restates the prompt (is
    an expression written in it, or wraps one of its math expressions: `_restates`);
  - `strict=False` (`reward.answer_match: lenient`) sends any pair that is not two equal numbers
    to math-verify and lets restated expressions match: the matching before strict existed.
Numbers are bounded before they are built (MAX_ANSWER_CHARS, MAX_EXPONENT), and math-verify
sees only short answers without huge powers or factorials (`_tame`), each comparison for at most
`oncurve.rewards.math.SYMBOLIC_TIMEOUT_S` (TimeoutError past it).
"""

from __future__ import annotations

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

_OPEN_TAG_RE = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG_RE = re.compile(r"</answer>", re.IGNORECASE)
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
# Thousands groups must be exact (`1,000`, not `1,00`), so a list like `1,2,3` gives `3`.
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})(?![\w])")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
# A box opener with the brace of its argument (group 1) or its unbraced argument (group 2,
# `\boxed 7`), or any other brace: one pass over these finds every box (`_last_boxed`).
_BOX_TOKEN_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])(?:[ \t]*(\{)|[ \t]+([^\s${}\\]+))?|[{}]")
_NON_SPACE_RE = re.compile(r"\S")

_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\left|\\right|\\displaystyle|\\[,;:! ]")
_WRAPPERS = (("**", "**"), ("__", "__"), ("*", "*"), ("`", "`"), ("$$", "$$"), ("$", "$"))
_WRAPPERS += (("\\(", "\\)"), ("\\[", "\\]"))
_STATED_RE = re.compile(
    r"""(?:[a-zA-Z]\s*=|\\approx|≈|=)?\s*
    (?P<sign>[-+]?)\s*(?:\$|€|£)?\s*(?P<sign2>[-+]?)\s*
    (?:
        \\frac\s*(?:\{\s*(?P<fnum>-?\d+)\s*\}|(?P<fnum1>\d))
                \s*(?:\{\s*(?P<fden>\d+)\s*\}|(?P<fden1>\d))
      | (?P<rnum>\d+)\s*/\s*(?P<rden>\d+)
      | (?P<whole>\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(?:\.(?P<decimals>\d*))?
        (?:[eE](?P<exp>[-+]?\d+))?
    )
    \s*(?:%|\^\s*\{?\s*\\circ\s*\}?|\\circ|°)?
    (?:(?:\s+|(?=[a-zA-Z]{2}))[a-zA-Z]+(?:[ /-]+[a-zA-Z]+){0,3}(?:\^\{?\d\}?)?)?
    \s*\.?""",
    re.VERBOSE,
)

_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
# An operation between terms, a power, a factorial, a command or a bracket: not a bare number
# or symbol (`-1` is not one).
_EXPRESSION_RE = re.compile(r".[-+*/^!]|\\[a-zA-Z]|\(")
_MATH_SEGMENT_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
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
        for finder in (_last_boxed, _gsm8k, _last_number):
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
    `prompt`, when given, is what a strict symbolic match must not restate. Raises TimeoutError
    when math-verify runs past its bound (the reward runner counts that row as a timeout)."""
    if predicted is None:
        return False
    pred, ref = normalize_answer(predicted), normalize_answer(str(gold))
    if not pred:
        return False
    if pred.lower() == ref.lower():
        return True
    gold_value = stated_number(str(gold))
    pred_value = stated_number(predicted, reduced=strict)
    if gold_value is not None and pred_value is not None:
        return pred_value == gold_value
    if strict and gold_value is not None:
        return False
    if gold_value is not None:
        ref = str(gold_value)
    if not (_looks_symbolic(pred) and _looks_symbolic(ref) and _tame(pred)):
        return False
    if strict and prompt and _restates(pred, prompt, ref):
        return False
    from oncurve.rewards.math import symbolic_equal

    return bool(symbolic_equal(pred, ref))


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
    """The value of `text` when it states one number: an integer, a decimal (`1e3` too) or a
    fraction (`3/4`, `\\frac{3}{4}`, `\\dfrac34`), with its dressing: sign, thousands separators
    (`1,000`, `1{,}000`, `1\\,000`), `$`, `%`, degrees, units in words or `\\text{}` (`72 apples`,
    `5\\text{ hours}`), a leading `x =` or `\\approx`, markdown emphasis, math delimiters, a box, a
    trailing period. With `reduced`, a fraction counts only in lowest terms with a denominator
    above 1 (`\\frac{58}{2}` is arithmetic left undone). None for anything else, including an
    answer longer than MAX_ANSWER_CHARS or an exponent beyond MAX_EXPONENT."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    match = _STATED_RE.fullmatch(_undress(text))
    if match is None or (match["sign"] and match["sign2"]):
        return None
    sign = -1 if "-" in (match["sign"], match["sign2"]) else 1
    num, den = match["fnum"] or match["fnum1"] or match["rnum"], match["fden"] or match["fden1"]
    den = den or match["rden"]
    if num is not None:
        numerator, denominator = int(num), int(den)
        if denominator == 0:
            return None
        if reduced and (denominator == 1 or math.gcd(numerator, denominator) != 1):
            return None
        return sign * Fraction(numerator, denominator)
    decimals = match["decimals"] or ""
    exponent = int(match["exp"] or 0) - len(decimals)
    if abs(exponent) > MAX_EXPONENT:
        return None
    digits = (match["whole"].replace(",", "") + decimals) or "0"
    return sign * Fraction(int(digits)) * Fraction(10) ** exponent


def _undress(text: str) -> str:
    """`text` without what surrounds a stated number: a box, `\\text{}` (its words kept as
    words), spacing commands, math delimiters, markdown emphasis; `\\dfrac` as `\\frac`."""
    text = text.strip()
    if _BOX_RE.search(text):
        text = _last_boxed(text) or text
    text = _TEXT_RE.sub(r" \1 ", text)
    text = _SPACING_RE.sub("", text.replace("\\ ", " ")).replace("~", " ")
    for old, new in (("{,}", ","), ("\\$", "$"), ("\\%", "%"), ("−", "-")):
        text = text.replace(old, new)
    text = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", text)
    # one space at most between parts: _STATED_RE's adjacent optional spaces would split a long
    # run in quadratically many ways before failing (45 ms for 1,000 spaces)
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
    return len(text) <= MAX_SYMBOLIC_CHARS and not re.search(
        r"[a-zA-Z]{4,}", _COMMAND_RE.sub("", text)
    )


def _tame(text: str) -> bool:
    """Safe to hand to math-verify: no number that sympy would build in C, past any timeout's
    reach and with gigabytes of memory (a tower `9^{9^{9^{9}}}`, `9!!!`, `1e999999999`, a
    binomial of powers). `text` is short (`_looks_symbolic`)."""
    if _EXPLOSIVE_RE.search(text):
        return False
    numeric = not re.search(r"[a-zA-Z]", _COMMAND_RE.sub("", text))
    if numeric and re.search(r"[)}]\s*!", text):  # (3!)!: a factorial of a computed number
        return False
    if re.search(r"\\(?:[dt]?binom|choose)", text) and re.search(r"\^|\d{4,}", text):
        return False
    for exponent in _exponents(text):
        letters = re.search(r"[a-zA-Z]", _COMMAND_RE.sub("", exponent))
        if re.search(r"\d{4,}", exponent) or (not letters and re.search(r"[\^!]", exponent)):
            return False
    return True


def _exponents(text: str) -> list[str]:
    """What follows each `^`: a braced group, a command or one character."""
    found = []
    for match in re.finditer(r"\^\s*", text):
        start = match.end()
        if text.startswith("{", start):
            depth = 0
            for end in range(start, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    break
            found.append(text[start + 1 : end + 1])
        else:
            found.append(re.match(r"\\[a-zA-Z]+|\d+|.?", text[start:]).group())
    return found


def _last_tag(text: str) -> str | None:
    close = _last_match(_CLOSE_TAG_RE, text, len(text))
    opening = None if close is None else _last_match(_OPEN_TAG_RE, text, close.start())
    return None if opening is None else text[opening.end() : close.start()].strip()


def _last_match(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    """The last match of `pattern` in `text[:end]`, in one pass (a lazy `.*?` search from each
    candidate start would rescan the rest of the text for each)."""
    last = collections.deque(pattern.finditer(text, 0, end), maxlen=1)
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


def _last_number(text: str) -> str | None:
    found = _last_match(_NUMBER_RE, text, len(text))
    return None if found is None else found.group()
