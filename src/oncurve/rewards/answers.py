"""Answer extraction from completions and answer matching against a reference.

Extraction styles (`extract_answer`):
  tags         the last `<answer>...</answer>`
  boxed        the last `\\boxed{...}` (or `\\fbox{...}`), nested braces balanced
  gsm8k        the text after the last `####` on its line
  last_number  the last number: `-12`, `1,000`, `3.5`, `3/4`
  auto         the first of tags, boxed, gsm8k, last_number that finds something; inside
               `<answer>` a `\\boxed{}` is unwrapped

Matching (`answers_match`) is exact after normalisation (whitespace, `$`, a trailing period,
`\\text{}`, `\\left`/`\\right`, a leading `x =`), then numeric with exact rationals (`1,000` =
`1000` = `1000.0`, `0.75` = `3/4` = `\\frac{3}{4}`), then symbolic through `math-verify` when
that optional extra is installed, either side is not a plain number, and both look like math
(at most 100 characters, no run of 4+ letters outside LaTeX commands).
"""

from __future__ import annotations

import re
from fractions import Fraction

STYLES = ("auto", "tags", "boxed", "gsm8k", "last_number")

_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
# Thousands groups must be exact (`1,000`, not `1,00`), so a list like `1,2,3` gives `3`.
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})(?![\w])")
MAX_SYMBOLIC_CHARS = 100
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


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


def answers_match(predicted: str | None, gold: str) -> bool:
    """True when `predicted` states the same answer as `gold` (see the module docstring)."""
    if predicted is None:
        return False
    pred, ref = normalize_answer(predicted), normalize_answer(str(gold))
    if not pred:
        return False
    if pred.lower() == ref.lower():
        return True
    pred_num, ref_num = parse_number(pred), parse_number(ref)
    if pred_num is not None and ref_num is not None:
        return pred_num == ref_num
    if not (_looks_symbolic(pred) and _looks_symbolic(ref)):
        return False
    from oncurve.rewards.math import symbolic_equal

    return bool(symbolic_equal(pred, ref))


def normalize_answer(text: str) -> str:
    """Canonical surface form: a boxed answer unwrapped, no whitespace, `$`, trailing period,
    `\\text{}` wrapper, `\\left`/`\\right`, degree or percent sign, or leading `x =`."""
    text = text.strip()
    if _BOX_RE.search(text):
        text = _last_boxed(text) or text
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\\left|\\right|\\[,;:! ]|\\displaystyle", "", text)
    text = re.sub(r"\^\{?\\circ\}?|\\%|%", "", text)
    text = text.replace("\\$", "").replace("$", "")
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"^[a-zA-Z]=(?!=)", "", text)
    return text.rstrip(".")


def parse_number(text: str) -> Fraction | None:
    """An exact rational from a normalised answer: `-1,000.5`, `3/4`, `\\frac{3}{4}`,
    `-\\dfrac34`, `1e3`; None when `text` is not a single number."""
    text = text.strip()
    sign = 1
    if text.startswith("-"):
        sign, text = -1, text[1:]
    frac = re.fullmatch(r"\\[dt]?frac(?:\{([^{}]+)\}|(\d))(?:\{([^{}]+)\}|(\d))", text)
    if frac:
        num = parse_number(frac.group(1) or frac.group(2))
        den = parse_number(frac.group(3) or frac.group(4))
        if num is None or den is None or den == 0:
            return None
        return sign * num / den
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?", text):
        text = text.replace(",", "")
    if re.fullmatch(r"\d+/\d+", text):
        num, den = text.split("/")
        return sign * Fraction(int(num), int(den)) if int(den) else None
    if not re.fullmatch(r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", text):
        return None
    return sign * Fraction(text)


def _looks_symbolic(text: str) -> bool:
    """Worth a symbolic comparison: short, and no words outside LaTeX commands. Prose costs
    math-verify tens of milliseconds per row and never matches."""
    return len(text) <= MAX_SYMBOLIC_CHARS and not re.search(
        r"[a-zA-Z]{4,}", re.sub(r"\\[a-zA-Z]+", "", text)
    )


def _last_tag(text: str) -> str | None:
    matches = _TAG_RE.findall(text)
    return matches[-1].strip() if matches else None


def _last_boxed(text: str) -> str | None:
    """Content of the last outermost `\\boxed{...}`, braces balanced (`\\boxed{\\frac{1}{2}}`);
    a box that only wraps another box is unwrapped."""
    found, pos = None, 0
    while True:
        match = _BOX_RE.search(text, pos)
        if match is None:
            break
        content, pos = _box_argument(text, match.end())
        if content is not None:
            found = content
    while found is not None:
        inner = _BOX_RE.match(found)
        if inner is None:
            break
        content, end = _box_argument(found, inner.end())
        if content is None or end != len(found):
            break
        found = content
    return found


def _box_argument(text: str, start: int) -> tuple[str | None, int]:
    """(argument, end) of a box opener ending at `start`: `{...}` balanced, or `\\boxed 5`."""
    brace = start + len(text[start:]) - len(text[start:].lstrip(" "))
    if brace < len(text) and text[brace] == "{":
        start = brace
        depth = 0
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + 1 : i].strip(), i + 1
        return None, len(text)
    plain = re.match(r"[ \t]+([^\s$]+)", text[start:])
    if plain is None:
        return None, start
    return plain.group(1).rstrip("."), start + plain.end()


def _gsm8k(text: str) -> str | None:
    matches = _GSM8K_RE.findall(text)
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


def _last_number(text: str) -> str | None:
    matches = _NUMBER_RE.findall(text)
    return matches[-1] if matches else None
