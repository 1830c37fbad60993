"""Answer extraction from completions (`extract_answer`).

Extraction styles (`extract_answer`), each linear in the completion's length:
  tags         the last `<answer>...</answer>` with something in it: a closing tag and the
               nearest opening tag before it
  boxed        the last outermost `\\boxed{...}` (or `\\fbox{...}`) with something in it, nested
               braces balanced; a box that only wraps another box is unwrapped
  gsm8k        the text after the last `####` whose line states a number (`stated_number`) or
               lists numbers (`3,4`) or hedges its number (`18 (or 19)`, whole), of the last
               GSM8K_LINES such lines, so a markdown heading such as `#### Step 2` is not taken
               for the answer
  last_number  the last number: `-12`, `1,000`, `3.5`, `3/4`, `1 1/2`, `\\frac{3}{4}`, `**18**`,
               not a power's base or exponent (`5^2`); none when it ends a hedge (`4 or 3`, `3
               to 4` but not `from 12 to 18`, `possibly 4`, `at least 4`), comes before a hedged
               power (`18 or 3²`) or is denied (`not 18`, `18 is wrong`)
  auto         the first of tags (a box, a `####` line or an answer statement after the last
               tags instead), boxed (two boxes offered together as a list; a `####` line,
               an answer statement or a choice's letter stated after the last box
               instead), gsm8k, the last
               stated answer in the completion's tail ("The final answer is $...$", "The answer
               is 18", "**Answer:** B"; the whole phrase where the sentence goes on to change,
               hedge or deny the number: "18 or 26", "18 squared", "3, but actually 4", not
               where a reason follows: "18, up 2 from yesterday", "$\\frac{3}{4}$ = 0.75"), the
               math of its last sentence (`_final_math`), a completion that is one short piece
               of math (`_whole_math`),
               last_number that finds something; inside `<answer>` a `\\boxed{}` is unwrapped
The stated number a gsm8k line must hold, box reading and the test for math worth a symbolic
comparison live in `oncurve.rewards.normalization`; matching in `oncurve.rewards.matching`.
"""

from __future__ import annotations

import bisect
import collections
import re
from fractions import Fraction

from oncurve.rewards.normalization import (
    BOX_RE,
    COMMAND_RE,
    ENVIRONMENT_RE,
    EQUALS_RE,
    LHS_RE,
    NOT_UNITS,
    SIGNS,
    UNIT_LETTERS,
    last_boxed,
    looks_symbolic,
    stated,
    stated_number,
)

STYLES = ("auto", "tags", "boxed", "gsm8k", "last_number")
GSM8K_LINES = 8  # `####` lines, from the last, that the gsm8k style reads
TAIL_CHARS = 2000  # the end of a completion where a stated "final answer is $...$" is read

# Whitespace longer than any pattern tells apart (`_short_run`)
_WHITESPACE_RUN_RE = re.compile(r"\s{3,}")
_OPEN_TAG_RE = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG_RE = re.compile(r"</answer>", re.IGNORECASE)
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
# Thousands groups must be exact (`1,000`, not `1,00`), so a list like `1,2,3` gives `3`; a
# mixed number is one (`1 1/2`, not `1/2`).
_NUMBER = (
    r"[-−]?\\[dtc]?frac\{\d+\}\{\d+\}"  # a fraction whole, not its denominator
    r"|[-−]?(?:\d+ \d+/\d+|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?)|[-−]?\.\d+"
)
# Written right after a number, what makes it another value (`2π`, `2½`, `2√3`)
_ATTACHED = "½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅐⅛⅜⅝⅞⅑⅒π√∞"
# A unit may follow without a space (`12.5m`); a letter before (`x2`, `H2O`) is no number, nor
# is a power or a power's exponent (`48 m^2` gives 48; `5^2`, `4e2`, `4²` give none), nor one
# with a constant, a root or a fraction's glyph right after it (`2π`, `2½`). A group
# of a run of thousands groups after a comma and another 3-digit group is not tried: the group
# before it was, with the same rest, so a run of groups is read once, not once per comma.
_NUMBER_RE = re.compile(
    rf"(?<![\w.^])(?<!\^\{{)(?!(?<=,\d{{3}},)\d{{3}},\d)(?:{_NUMBER})"
    rf"(?![\d_]|[.,]\d|\s*\^|[eE][-+]?\d|[⁰¹²³⁴⁵⁶⁷⁸⁹{_ATTACHED}])"
)
_STATED_ANSWER_RE = re.compile(
    r"answer\s*(?:is|:)\s*(?:\*\*)?\s*(?:\$\$?(?P<math>(?:\\\$|[^$]){1,500})\$"
    r"|\\\((?P<inline>.{1,500}?)\\\))",
    re.IGNORECASE,
)
_SCALE_WORDS = r"thousand|million|billion|trillion"
# The rest is looked at, not consumed: a later statement on the line is the last one.
_ANSWER_NUMBER_RE = re.compile(
    rf"answer\s*(?:is|:)\s*(?:\*\*)?\s*\\?\$?\s*(?P<number>(?:[-−] )?(?:{_NUMBER})"
    rf"(?![\d_]|\.\d|,\d{{3}}(?!\d))"
    rf"(?:\s+(?:{_SCALE_WORDS})\b)?(?:\s*\\?%|\s+per\s?cent\b)?)(?=(?P<rest>[^\n]{{0,200}}))",
    re.IGNORECASE,
)
# What may not follow a stated number in its sentence (its closing emphasis or `$` read past
# whole: `**18**.`): an operator, a factorial or a power (`18 + 1`, `18!`, `18^2`, `18²`,
# `18e2`, `18 x 10^2`), a constant, root or fraction's glyph (`2π`, `2 \pi`, `2½`), another
# number joined to it (`18, 19`, `18 (or 19)`, `18 to 20`), or a word that denies it (`18
# (wrong)`, `18 — no, 19`). A reason after it may hold numbers (`18 (6 × 3)`, `18: 6 in each
# of 3 bags`).
_QUALIFIED_RE = re.compile(
    rf"\s*(?:\$|\*\*)*+\s*(?:[-−+*/^!×·÷±∓=<>–⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁄∨∧|~≈≤≥≠&{_ATTACHED}]"
    r"|\\(?:times|cdot|div|pm|mp|pi|sqrt|infty)(?![a-zA-Z])|[eE][-+]?\d|[xX]\s*\d"
    r"|[,—]?\s*(?:(?:or|and|and/or|to|vs\.?|versus)\s+)?"
    r"(?:(?:possibly|maybe|perhaps|even|rather|actually)\s+)?\$?[-−]?\d"
    r"|\(\s*(?:or|and/or|to|vs\.?|versus|possibly|maybe|perhaps)\b"
    r"|[(,;:—]?\s*(?:no|not|wrong|incorrect)\b)",
    re.IGNORECASE,
)
# Its unit's words, then another number joined to it (`18 apples (or 19)`, `18 apples, or
# maybe 19`, `18 apples or 19 apples`): a hedge unless the other number is the same quantity in
# other units (`2 hours, or 120 minutes`) or the same number (`18 dollars (or $18.00)`)
_UNIT_HEDGE_RE = re.compile(
    r"(?P<unit>(?:\s+[a-zA-Z]+){1,3})\s*(?:[,(]?\s*(?:or|and/or|vs\.?|versus)\s+"
    r"(?P<doubt>(?:maybe|perhaps|possibly|even|rather)\s+)?"
    r"|[,(]\s*(?P<doubt2>maybe|perhaps|possibly)\s+)"
    r"\$?(?P<other>[-−]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)(?P<unit2>(?:\s+[a-zA-Z]+){0,3})",
    re.IGNORECASE,
)
# Units whose amounts convert to one another: (what they measure, size in the smallest unit)
_UNITS = {
    name: (measure, Fraction(size))
    for measure, sizes in {
        "time": {
            "second": 1,
            "sec": 1,
            "minute": 60,
            "min": 60,
            "hour": 3600,
            "hr": 3600,
            "day": 86400,
            "week": 604800,
        },
        "money": {
            "cent": 1,
            "penny": 1,
            "pennies": 1,
            "nickel": 5,
            "dime": 10,
            "quarter": 25,
            "dollar": 100,
        },
        "length": {
            "inch": 1,
            "foot": 12,
            "feet": 12,
            "yard": 36,
            "mile": 63360,
            "millimeter": Fraction(5, 127),
            "centimeter": Fraction(50, 127),
            "meter": Fraction(5000, 127),
            "kilometer": Fraction(5000000, 127),
            "ft": 12,
            "mi": 63360,
            "mm": Fraction(5, 127),
            "cm": Fraction(50, 127),
            "m": Fraction(5000, 127),
            "km": Fraction(5000000, 127),
        },
        "mass": {
            "gram": 1,
            "g": 1,
            "kilogram": 1000,
            "kg": 1000,
            "ounce": Fraction("28.349523125"),
            "oz": Fraction("28.349523125"),
            "pound": Fraction("453.59237"),
            "lb": Fraction("453.59237"),
        },
        "volume": {"milliliter": 1, "ml": 1, "liter": 1000},
    }.items()
    for name, size in sizes.items()
}
# Words after a second number that make it the same thing under another condition
_CONDITION_WORDS = frozenset(
    [
        "with",
        "if",
        "in",
        "for",
        "including",
        "plus",
        "after",
        "before",
        "more",
        "total",
        "when",
        "without",
        "excluding",
    ]
)
# The next sentence or line takes it back or offers another number at once (`18. Or 19.`,
# `18\nor 19`, `18. Maybe 19.`, `18. Actually, it is 19.`, `18. No, wait, it is 20.`, `18.
# Sorry, I meant 19.`, `18. Sorry — I meant 19.`, `18. I made an error; it should be 19.`, `18.
# Alternatively, 19.`, `18. It might be 19.`; not `18. Actually, that is 9 eggs ...`
# nor `No. of eggs sold: 9`)
_RETRACTED_RE = re.compile(
    r"[^\n.!?]{0,200}(?:[.!?]\s+(?:or|actually|wait|no(?=\s*[,:!])|correction|hmm|rather"
    r"|(?:maybe|perhaps|possibly)(?=\s+(?:it's\s+|it\s+is\s+)?\$?[-−]?\d)"
    r"|but\s+wait|sorry(?=\s*[,:!—-])|i\s+meant|never\s*mind|on\s+second\s+thought"
    r"|scratch\s+that|oops|whoops|my\s+(?:bad|mistake)|i\s+made\s+(?:an?\s+)?(?:error|mistake)"
    r"|alternatively|it\s+(?:might|could)\s+(?:also\s+)?be)\b"
    r"(?![,:\s]*(?:that\s+is\s+\$?\d|that's\s+(?:\$?\d|per\b)|which\s+is|i\.e\."
    r"|in\s+(?:other\s+)?words|written\s+out|equivalently|because|since))"
    # a next line that is only another number, in a unit if any (`18\nor 19`, `18\nor perhaps
    # 20`, `540 meters\nor 600 meters`; `_stated_answer` passes over another unit's: `18
    # dollars\nor 1800 cents`)
    r"|[ \t]*\n\s*(?P<line>(?:or\s+)?(?:maybe|perhaps|possibly)|or)"
    r"(?=\s+\$?[-−]?\d[\d,]*(?:\.\d+)?(?P<unit>(?:\s+[a-zA-Z]+){0,2})\s*[.!?]?[ \t]*(?:\n|$)))"
    r"(?P<after>[^\n]{0,80})",
    re.IGNORECASE,
)
# A multiple choice's letter, with or without its brackets
_CHOICE_RE = re.compile(r"\(?[A-E]\)?")
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
# An environment from its `\\begin` to its `\\end`, the line breaks of its layout inside
_ENVIRONMENT_SPAN_RE = re.compile(
    r"\\begin\s*\{(?P<name>[a-zA-Z*]+)\}.*?\\end\s*\{(?P=name)\}", re.DOTALL
)
_INLINE_MATH_RE = re.compile(r"(?<!\\)\$\$?((?:\\\$|[^$]){1,500})\$\$?")
_JOINER_RE = re.compile(r"\s*(?:,|and|or|,\s*and|,\s*or)\s*", re.IGNORECASE)
# Words that say a number is near another (`18, roughly 19`)
_NEAR_WORDS = r"roughly|about|approximately|approx\.?|around|nearly|almost|close\s+to|~|≈"
# Just before the last number, what makes it no answer: a hedge between it and another (`4 or 3`,
# `19, or perhaps 18`, `3 (or 4)`, `3 apples or 4`, `x = 17 or x = 18`, `19 vs 18`, `between 17
# and 18`), a range (`3 to 4`, `3-4`; not a change, `_CHANGE_TO_RE`), a doubt (`possibly 4`,
# `maybe 4`), an approximation of a number before (`18, roughly 19`), a bound (`at least 4`, `more
# than 4`, `up to 4`, `nearly 4`) or a negation (`not 18`, `can't be 18`); just after it, a denial
# (`18 is wrong`) or an operator (`4×10^2`, whose power is no number of its own).
_HEDGE_RE = re.compile(
    r"(?:\d\s*(?:\$\s*)?(?:[,.(—–]|[a-zA-Z]+\s+(?=or\b))?\s*"
    r"(?:or|and/or|vs\.?|versus|(?P<to>to))\s*"
    r"(?:(?:maybe|perhaps|possibly|even|rather|else)\s+)?(?:[a-zA-Z]\s*=\s*)?"
    r"|\d\s*-\s*"
    r"|\bbetween\s+\S+\s+and\s+"
    rf"|\d\s*[,(]\s*(?:or\s+)?(?:{_NEAR_WORDS})\s+"
    r"|\b(?:maybe|perhaps|possibly|probably|i\s+guess|at\s+(?:least|most)|up\s+to|under|over"
    r"|below|above|nearly|almost|(?:more|less|fewer|greater|smaller)\s+than)\s+"
    r"|(?:\bnot|n't|\bnever|\bno)\s+(?:[a-zA-Z]+\s+){0,2})(?:\$\s*)?[-−]?$",
    re.IGNORECASE,
)
# A change from one number to another ends on the second, no range: `from 12 to 18`,
# `increases by 2 to 18`, `went from $12 to $18`
_CHANGE_TO_RE = re.compile(
    r"\b(?:from|by|increased?|increases|rose|rises?|grew|grows?|up|down|dropped|drops?|fell"
    r"|falls?|changed?|changes|went|goes|go)\s+\$?\s*[-−]?\d[\d,.]*\s*(?:\$\s*)?to\s*(?:\$\s*)?$",
    re.IGNORECASE,
)
# Words that make `from 18 to 20` a range the answer lies in, not a change
_SPAN_RE = re.compile(
    r"\b(?:anywhere|somewhere|could|might|may|range[sd]?|ranging|between|depending)\b",
    re.IGNORECASE,
)
# An operator after the last number (`9 * 2`, `4×10^2`); a `*` only where an operand follows,
# for `**18**` and `*18*` are markdown emphasis
_OPERAND_RE = re.compile(
    r"\s*(?:\*(?!\*)(?=\s*[-\d(\\$])|[×·÷^]|\\(?:times|cdot|div)(?![a-zA-Z])|[xX]\s*\d)"
)
# A power after the last number, which is read as no number (`2^{4}`, `3²`, `4e1`): where a
# hedge comes before it (`18, or maybe 2^{4}`, `18 or 4e1`), the number before is no answer;
# else it is (`32, since 2^5`)
_POWER_AFTER_RE = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?:\s*\^|[eE][-+]?\d|[⁰¹²³⁴⁵⁶⁷⁸⁹])")
_JOINED_BEFORE_RE = re.compile(
    r"\b(?:or|and/or|vs\.?|versus)\s+(?:(?:maybe|perhaps|possibly|even|rather)\s+)?\$?\s*$",
    re.IGNORECASE,
)
# A minus sign set apart from its number after a relation (`is - 4`, `= - 4`), not a difference
# (`10 - 4`) nor a dash after a word (`Final answer - 18`)
_SPACED_SIGN_RE = re.compile(r"(?:\b(?:is|are|was|were|be|equals?)|[=(])\s*-\s+$")
# After a stated number, what makes another number in its sentence a second answer or a change
# of it: a hedge word with the number close after it, after the unit's words (`3, but actually
# 4`, `3 (if not 4)`, `3; or 4`, `3 \text{ or } 4`, `3, though it might be 4`); a word of
# arithmetic before it (`18 mod 5`, `18 dollars less 2`, `18 raised to 2`; adding or taking 0
# changes nothing); a word set right between the two (`3 C 2`, `3 over 2 days`) that is no
# reason. Any other word first ends the look: what follows is a reason or a condition, whatever
# numbers it holds (`18, up 2 from yesterday`, `18 if she sells all 9`, `2 hours, equivalent to
# 120 minutes`, `18, or about 18.0`, `18 in 2 days`).
_CLAUSE_WORDS = r"because|since|as|if|when|which|that|so|i\.e|e\.g"
_REASON_WORDS = (
    r"because|since|as|given|from|so|thus|hence|therefore|which|that|i\.e|e\.g|each|per|every"
    r"|with|in|of|for|after|before|when|where|by|is|are|was|were|makes?|gives?|equals?|at|on"
    r"|out|if|within|until|than|and|today|daily|weekly|monthly|yearly|total"
)
_SECOND_ANSWER_RE = re.compile(
    r"[\s,;:(—*$-]*(?:\\text\s*\{\s*)?"
    rf"(?:(?!(?:{_CLAUSE_WORDS})\b)[a-zA-Z]+\b[\s,;:()—-]*){{0,3}}?"
    r"(?:(?:or|nor|but|though|although|otherwise|else|alternatively|either|vs\.?|versus)\b"
    r"[\s,]*(?:(?:maybe|perhaps|possibly|probably|actually|rather|even|else|instead|really"
    r"|if\s+not|it(?:'s|\s+is|\s+(?:might|could|may|would)(?:\s+(?:also|well|even))?\s+be))\b"
    r"[\s,]*){0,2}"
    r"|(?:if\s+not|maybe|perhaps|possibly|probably|actually|rather)\b[\s,]*)"
    r"\}?\s*\$?[-−]?(?:\d|\\[dtc]?frac\b)"
    r"|[\s$*]*(?:[a-zA-Z]+\s+){0,3}?(?:(?:mod|choose|times|over|divided\s+by|multiplied\s+by"
    r"|raised\s+to|to\s+the\s+power\s+of)\s+|(?:less|minus|plus)\s+(?!0(?![\d.,])))\$?[-−]?\d"
    rf"|[\s$*]*(?!(?:{_REASON_WORDS})\b)[a-zA-Z]+\s+\$?[-−]?\d",
    re.IGNORECASE,
)
# Anywhere in the sentence, a hedge word that offers another number (a digit or a `\frac`)
# whatever comes before it
# (`18 if I'm not mistaken, else 19`, `18, which otherwise would be 19`, `18 unless she eats 2,
# then 16`)
_STRONG_HEDGE_RE = re.compile(
    r"\b(?:else|otherwise|alternatively|instead|if\s+not|or\s+(?:maybe|perhaps|possibly)"
    r"|but\s+(?:actually|maybe|rather)|unless(?:\b[^.;]{0,60}?\b(?:then|it's|it\s+is))?"
    r"|failing\s+that|as\s+well\s+as|(?:might|could|may)\s+be"
    r"|(?:might|could|may|would)\s+(?:actually|also|well|even)\s+be)\b[\s,]*"
    r"(?:it(?:'s|\s+is|\s+(?:might|could|would)\s+be)\s+)?\$?[-−]?(?:\d|\\[dtc]?frac\b)",
    re.IGNORECASE,
)
# Anywhere in the sentence, another number said to be an answer too (`18; 19 is also
# acceptable`, `18 (19 would also be right)`, `$3$, with $4$ also possible`)
_ALSO_ANSWER_RE = re.compile(
    r"(?<![\w.])(?P<other>[-−]?\d[\d,]*(?:\.\d+)?)\$?\s+"
    r"(?:instead\b|(?P<words>(?:[a-zA-Z]+\s+){0,2}?)also\s+(?:be\s+)?"
    r"(?:acceptable|possible|correct|right|valid|plausible|works?|an?\s+(?:\w+\s+)?answer)\b)",
    re.IGNORECASE,
)
# Words between a number and "also acceptable" that say it is (`19 would also be right`); any
# other is its unit (`1800 cents is also correct`: the same amount)
_SAYING_WORDS = frozenset(("is", "are", "was", "would", "could", "might", "may", "will", "be"))
# After a condition or a reason, another number offered with "or" at the sentence's end or
# under a condition of its own (`18 if she sells all, or 19`, `18, up from 16, or 19`, `18 if
# she sells all, or 16 if two break`); one with a unit, an operator or the same value restates
# it (`540 meters, as 9 x 60 = 540, or 0.54 km`, `18, since ..., or 36/2`)
_OR_AFTER_CLAUSE_RE = re.compile(
    r"\b(?:if|since|because|as|when|from|unless|assuming|given)\b[^.;]{0,80}?,\s*or\s+"
    r"(?:(?:maybe|perhaps|possibly|even)\s+)?\$?(?P<other>[-−]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)"
    r"\$?\s*(?:[.!?]?\s*$|(?:if|when|with|unless|in|as|from|for)\b)",
    re.IGNORECASE,
)
# Right after a stated number and its unit, another one said near it or in brackets alone (`18,
# roughly 19`, `18 dollars (19?)`, `18, i.e. about 19`): a second answer where its value differs
# (`18, or about 18.0` restates it; one with a unit or a percent sign of its own, `18, around 2
# dozen`, is another quantity)
_NEAR_NUMBER_RE = re.compile(
    r"(?:\s+[a-zA-Z]+){0,2}?\s*(?:\$|\*\*)*\s*(?:[,;]\s*(?:or\s+|i\.e\.,?\s*|which\s+is\s+"
    rf"|that\s+is\s+)?(?P<near>{_NEAR_WORDS})\s*|\(\s*(?P<bracket>)(?:(?:{_NEAR_WORDS})\s*)?)"
    r"\$?(?P<other>[-−]?\d[\d,]*(?:\.\d+)?)(?![\d,./]*\d|\s*[a-zA-Z%\\])"
    r"(?(bracket)\s*\??\s*\))",
    re.IGNORECASE,
)
# After stated math, an approximation or the same value in another form is no second answer
# (`$\frac{\sqrt{3}}{2}$, approximately 0.866`, `$\frac{3}{4}$ = 0.75`, `$9\pi$, or roughly
# 28.27`)
_APPROXIMATION_RE = re.compile(
    r"\s*(?:\$|\*\*)*\s*[,(]?\s*(?:or\s+)?(?:=|≈|~|\\approx\b|(?:approx|approximately|about"
    r"|roughly|around|nearly|almost|equivalently)\b)",
    re.IGNORECASE,
)
# Stated math, then another number in brackets or after "or" (`$\frac{1}{2}$ (or 50%)`)
_OTHER_FORM_RE = re.compile(
    r"\s*(?:\$|\*\*)*\s*[,(]?\s*or\s+\$?(?P<other>[-−]?\d[\d,]*(?:\.\d+)?(?:/\d+)?\s*\\?%?)\$?"
    r"\s*\)?\s*[.!]?\s*$",
    re.IGNORECASE,
)
# A stated sum worked out to its result, one `=` (`48 + 24 = 72`)
_SUM_OPERAND = r"\s*\d+(?:,\d{3})*(?:\.\d+)?\s*"
_WORKED_SUM_RE = re.compile(
    rf"(?P<sum>{_SUM_OPERAND}(?:[-−+*/×·÷]{_SUM_OPERAND})+)="
    r"\s*(?P<result>[-−]?\d+(?:,\d{3})*(?:\.\d+)?)\s*\.?"
)
# The number a `####` line starts with
_LEADING_NUMBER_RE = re.compile(rf"\\?\$?\s*(?:{_NUMBER})(?![\d_]|[.,]\d)")
# A `####` line that lists numbers (`#### 3,4`): two answers, read whole
_NUMBER_LIST_RE = re.compile(r"[-−]?\d+(?:\.\d+)?(?:\s*[,;]\s*[-−]?\d+(?:\.\d+)?)+\.?")
# Words that change a number in a box but may be the unit a question asks for ("How many dozen
# eggs?" "The answer is 7 dozen."; "How many more apples?" "The answer is 5 more apples.")
_QUESTION_UNITS = frozenset(("dozen", "dozens", "more", "fewer", "less"))
# A time of day after a number (`3 p.m.`, `9 am`): a unit, not the letter `p`
_TIME_OF_DAY_RE = re.compile(r"\s*[ap]\.?m\b\.?", re.IGNORECASE)
_FIRST_WORD_RE = re.compile(r"\s*(?:\$|\*\*)*\s*([a-zA-Z]+)")
_DENIED_RE = re.compile(
    r"[\s$]*(?:(?:is|are|was|were)\s+(?:wrong|incorrect|not)|or\s+so)\b", re.IGNORECASE
)
_LINE_RE = re.compile(r"[^\n]{0,200}")
_THINK_CLOSE_RE = re.compile(r"</think>", re.IGNORECASE)
# A chat template's end of a turn or start of the next, which a model may run on into: what
# follows is no part of its answer (`... is $(7, 6)$. <|im_start|>user ...`).
_END_OF_TURN_RE = re.compile(
    r"<\|(?:im_end|im_start|eot_id|start_header_id|end_header_id|endoftext|end|user|assistant)"
    r"\|>|<end_of_turn>|<start_of_turn>"
)
# The assistant's own turn header, which a completion may open with
_ASSISTANT_HEADER_RE = re.compile(
    r"\s*(?:<\|im_start\|>\s*assistant|<\|start_header_id\|>\s*assistant\s*<\|end_header_id\|>"
    r"|<\|assistant\|>|<start_of_turn>\s*model)"
)
# A fenced code block (to the end of the text when unclosed)
_FENCED_CODE_RE = re.compile(
    r"```[ \t]*(?P<tag>[\w+#.-]*)[ \t]*\n(?P<body>.*?)(?:```|\Z)", re.DOTALL
)
# Fences that hold text, not a program (unless it reads as one)
_TEXT_FENCES = frozenset(("", "text", "txt", "plaintext", "markdown", "md", "latex", "tex", "math"))
_PROGRAM_RE = re.compile(
    r"^\s*(?:def |class |import |from \S+ import |print\(|for .+ in |while |return\b|#include"
    r"|>>>|//|console\.log|let |const |var )|;\s*$|^\s*[A-Za-z_]\w*\s*=(?!=)",
    re.MULTILINE,
)
# A box whose argument nests braces two deep at most (`\boxed{\frac{\sqrt{3}}{2}}`), and what
# may join two of them that offer two answers: spacing (`\quad`, `~`), display-math brackets,
# punctuation, brackets, `\text{}` or `\textbf{}` and joining or doubting words (`\boxed{71}
# \text{ or } \boxed{72}`, `\boxed{71} (or \boxed{72})`, `\boxed{71}. Alternatively,
# \boxed{72}`), an aside after such a word (`\boxed{71} or (depending on how she counts)
# \boxed{72}`), or a condition (`\boxed{71} if she counts all, otherwise \boxed{72}`); prose
# or a sentence's end alone between them is none.
_FLAT_BOX_RE = re.compile(
    r"\\(?:boxed|fbox)\s*\{(?P<content>(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\}){1,200})\}"
)
_GAP_CHARS = r"[\s$~,;()]*"
_BOX_JOINER_RE = re.compile(
    rf"{_GAP_CHARS}(?:(?:[.!]\s*)?(?:or|and|and/or|also|vs\.?|versus|otherwise|else|either"
    rf"|maybe|perhaps|possibly|alternatively)\b{_GAP_CHARS}"
    rf"(?:(?:it\s+(?:is|could\s+be|might\s+be|may\s+be)|it's)\b{_GAP_CHARS})?"
    rf"(?:\([^()]{{0,60}}\){_GAP_CHARS})?)*"
    rf"|{_GAP_CHARS}if\b[^.!?\n]{{0,80}}\b(?:otherwise|else)\b{_GAP_CHARS}",
    re.IGNORECASE,
)
_GAP_TEXT_RE = re.compile(
    r"\\(?:text|textrm|textnormal|textbf|textit|emph|mathrm|mathbf|mbox)\s*\{([^{}]*)\}"
)
_GAP_SPACING_RE = re.compile(r"\\(?:q?quad|hspace\*?\s*\{[^{}]*\}|[,;:! \[\]()])")
MAX_BOX_GAP = 120
MAX_JOINED_BOXES = 16  # boxes offered together, read back from the last


def extract_answer(text: str, style: str = "auto") -> str | None:
    """The answer part of a completion (of its own turn: `_own_turn`), stripped, or None when
    `style` finds none; a dash written for a minus is read as `-` (`SIGNS`). `auto` reads what
    follows the reasoning (after the last `</think>`) outside fenced code: a number a program
    prints or a thought states is not the answer the completion gives."""
    if style not in STYLES:
        raise ValueError(f"extract_answer: style must be one of {', '.join(STYLES)}, got {style!r}")
    text = _WHITESPACE_RUN_RE.sub(_short_run, text.translate(SIGNS))  # `–4` is -4, `4％` is 4%
    if style == "auto":
        text, reasoning_only = answer_region(text)
        tagged = _last_tag_span(text)
        if tagged is not None:
            later = _stated_after_tags(text[tagged[1] :])
            return later or _boxed(tagged[0]) or tagged[0]
        if (after_box := _stated_after_last_box(text)) is not None:
            return after_box
        finders = (_boxed, _gsm8k, _stated_answer, _final_math, _whole_math, _last_number)
        if reasoning_only:  # a reasoning's own numbers are its work: only what it states
            finders = (_boxed, _gsm8k, _stated_answer, _final_math, _plain_statement)
        for finder in finders:
            found = finder(text)
            if found is not None:
                return found
        return None
    return {"tags": _last_tag, "boxed": last_boxed, "gsm8k": _gsm8k, "last_number": _last_number}[
        style
    ](_own_turn(text))


def _short_run(run: re.Match[str]) -> str:
    """A run of whitespace of `_WHITESPACE_RUN_RE` as two spaces, or the line breaks it holds,
    two at most: what the patterns read in it (a space, a line break, a paragraph's end) stays,
    and no pattern that allows space at several places in a row (`answer\\s*(?:is|:)\\s*
    (?:\\*\\*)?\\s*`) tries each split of a long run."""
    breaks = min(run.group().count("\n"), 2)
    return "\n" * breaks if breaks else "  "


def answer_region(text: str) -> tuple[str, bool]:
    """(The part of a completion where `extract_answer(style="auto")` looks for its answer,
    whether that part is the reasoning): the text after the last `</think>` (all of it without
    one), or the reasoning before it when nothing but space follows it, with fenced programs
    left out (`_outside_code`), in the completion's own turn (`_own_turn`). From the reasoning,
    `auto` takes only an answer it states."""
    text, reasoning_only = _after_thinking(text)
    return _own_turn(_FENCED_CODE_RE.sub(_outside_code, text)), reasoning_only


def _own_turn(text: str) -> str:
    """The completion's own turn: its text up to a chat template's first turn marker, after the
    assistant's turn header it may open with (a turn of another role is no answer of its)."""
    header = _ASSISTANT_HEADER_RE.match(text)
    return _END_OF_TURN_RE.split(text[header.end() if header else 0 :], maxsplit=1)[0]


def _stated_after_last_box(text: str) -> str | None:
    """The answer a statement after the completion's last box gives, else None: its `####`
    line (`_gsm8k`) or its "The final answer is $...$", "The answer is 47", "**Answer:** 47"
    (`_stated_answer`), or a choice's letter it states (`_later_statement`). A box of a step's
    result is no final answer that a later sentence gives (`\\boxed{255} ... The final answer
    is $10,455$`), and a box followed by another answer is not paid as the box's
    (`\\boxed{46}. The answer is 47.`, `\\boxed{B}. The answer is C.`)."""
    last = _last_match(BOX_RE, text, len(text))
    return None if last is None else _later_statement(text[last.end() :])


def _later_statement(after: str) -> str | None:
    """The answer `after` (what follows a box or answer tags) states, else None: its `####`
    line, its "The final answer is $...$", "The answer is 47", "**Answer:** 47", or a choice's
    letter it states last ("The answer is C."; no other word: "I hope this answer is
    correct.")."""
    if (found := _gsm8k(after)) is not None:
        return found
    if _STATED_ANSWER_RE.search(after) or _ANSWER_NUMBER_RE.search(after):
        return _stated_answer(after)
    word = _ANSWER_WORD_RE.search(after)
    return word["word"] if word is not None and _CHOICE_RE.fullmatch(word["word"]) else None


def _stated_after_tags(after: str) -> str | None:
    """The answer stated after a completion's last `<answer>...</answer>` pair (`after`), else
    None: a box there, or a statement after it or without one (`_later_statement`). The last
    statement is the answer, as after a box: `<answer>46</answer> then \\boxed{47}` answers
    47."""
    return _stated_after_last_box(after) or _boxed(after) or _later_statement(after)


def _last_tag(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` pair with something in it
    (`_last_tag_span`)."""
    found = _last_tag_span(text)
    return None if found is None else found[0]


def _last_tag_span(text: str) -> tuple[str, int] | None:
    """(The content of the last `<answer>...</answer>` pair with something in it, where its
    closing tag ends): its closing tag and the nearest opening tag before it. Empty pairs (a
    format quoted) are passed over."""
    # offsets, not match objects: thousands of tracked objects would set off the collector
    openings = [match.end() for match in _OPEN_TAG_RE.finditer(text)]
    closes = [match.start() for match in _CLOSE_TAG_RE.finditer(text)]
    for close in reversed(closes):
        before = bisect.bisect_right(openings, close) - 1
        if before < 0:
            return None
        content = text[openings[before] : close].strip()
        if content:
            return content, _CLOSE_TAG_RE.match(text, close).end()
    return None


def _boxed(text: str) -> str | None:
    """The last box's content (`last_boxed`); with the box before it when the two are offered
    together (`\\boxed{50} or \\boxed{18}`, `_BOX_JOINER_RE`), in the text or in the last box
    (`\\boxed{\\boxed{50} \\text{ or } \\boxed{18}}`), as a list ("50 \\text{ or } 18") that
    matching pays only where the reference lists both."""
    answer = last_boxed(text)
    if answer is None:
        return None
    inner = last_boxed(answer) if BOX_RE.search(answer) else None
    if inner is not None:
        return _joined_boxes(answer, inner) or answer
    return _joined_boxes(text, answer) or answer


def _joined_boxes(text: str, answer: str) -> str | None:
    """ "first \\text{ or } ... \\text{ or } `answer`" when the last boxes of `text` are offered
    together (each joined to the next) with two answers or more among them, and the last one
    holds `answer`; else None. The same answer boxed twice is one answer; a chain longer than
    `MAX_JOINED_BOXES` is no one answer (it is read no further)."""
    boxes = list(collections.deque(_FLAT_BOX_RE.finditer(text), maxlen=MAX_JOINED_BOXES + 2))
    if len(boxes) < 2 or boxes[-1]["content"].strip() != answer:
        return None
    if BOX_RE.search(text, boxes[-1].end()):
        return None
    offered = [answer]
    pairs = zip(reversed(boxes[:-1]), reversed(boxes[1:]), strict=True)
    for count, (first, second) in enumerate(pairs):
        gap = text[first.end() : second.start()]
        if len(gap) > MAX_BOX_GAP:
            break
        gap = _GAP_SPACING_RE.sub(" ", _GAP_TEXT_RE.sub(r" \1 ", gap))
        if not _BOX_JOINER_RE.fullmatch(gap):
            break
        if count == MAX_JOINED_BOXES:  # a longer chain is read no further: no one answer
            return " \\text{ or } ".join(["\\ldots", *offered])
        content = first["content"].strip()
        if content not in offered:
            offered.insert(0, content)
    if len(offered) < 2:
        return None
    return " \\text{ or } ".join(offered)


def _after_thinking(text: str) -> tuple[str, bool]:
    """(`text` after its last `</think>`, all of it without one; False), or, when nothing but
    space follows it, (the reasoning before it, True): its answer only where it states one."""
    close = _last_match(_THINK_CLOSE_RE, text, len(text))
    if close is None:
        return text, False
    after = text[close.end() :]
    if after.strip():
        return after, False
    return re.sub(r"(?i)<think>", " ", text[: close.start()]), True


def _plain_statement(text: str) -> str | None:
    """The last number of `text`'s last sentence when that sentence states it without working
    (`She makes 18.`, not `9 * 2 = 18.`)."""
    sentence = _SENTENCE_END_RE.split(text.rstrip().rstrip(".").strip())[-1]
    named = re.fullmatch(r"\s*[A-Za-z]\w*\s*=\s*(\$?[-−]?\d[\d,]*(?:\.\d+)?)\s*", sentence)
    if named is not None:  # `x = 3`
        return named[1]
    if re.search(r"[=*×+÷/]|\d\s*-\s*\d|\\(?:times|cdot|div)", sentence):
        return None
    return _last_number(sentence)


def _outside_code(block: re.Match[str]) -> str:
    """A fenced block as `extract_answer` reads it: a program (a language's tag, or code in an
    untagged or text block) as a line break, any other block as it is."""
    tag = block["tag"].strip().lower()
    if tag and tag not in _TEXT_FENCES:
        return "\n"
    last = not block.string[block.end() :].strip()  # the completion ends on it: its answer
    return "\n" if not tag and not last and _PROGRAM_RE.search(block["body"]) else block.group()


def _unit_hedged(number: str, rest: str) -> bool:
    """Whether `rest`, after the stated `number`, offers another number after its unit
    (`_UNIT_HEDGE_RE`)."""
    found = _UNIT_HEDGE_RE.match(rest)
    if found is None:
        return False
    if found["doubt"] or found["doubt2"]:
        return True
    values = [stated_number(n) for n in (number, found["other"])]
    if None in values:
        return True
    unit, other = found["unit"].lower().split(), found["unit2"].lower().split()
    if not other or other[0] in _CONDITION_WORDS:  # `(or 19 with tax)`: another amount
        return values[0] != values[1]  # `18 dollars (or $18.00)` restates it
    compound = re.match(r"\s*\d", rest[found.end() :]) is not None  # `2 hours 30 minutes`
    if "and" in other or compound or "per" in unit + other:  # `2 hours and 30 minutes`, rates
        return False
    if other == ["dozen"]:
        other = ["dozen", *unit]
    scales = [_unit_scale(" ".join(unit)), _unit_scale(" ".join(other))]
    if scales[0][0] == scales[1][0]:
        # in the same units, or ones that convert: `2 hours, or 120 minutes`; `19 dollars
        # total` and `19 apples` are other amounts
        return values[0] * scales[0][1] != values[1] * scales[1][1]
    return True  # another thing: `18 eggs or 36 dollars`, `10 cups and/or 5 bowls`


def _unit_scale(words: str) -> tuple[str, Fraction] | None:
    """(what the unit `words` measures, its size in that measure's smallest unit): a unit of
    `_UNITS` (`hours`, `of an hour`), else a count of the thing it names (`apples`, and `dozen
    apples` twelve of them); None without a word."""
    names = [w.lower() for w in words.split() if w.lower() not in ("of", "a", "an", "the")]
    if not names:
        return None
    scale = Fraction(1)
    if names[0] == "dozen" and len(names) > 1:
        names, scale = names[1:], Fraction(12)
    for name in (names[0], names[0][:-1], names[0][:-2]):  # `hours`, `inches`
        if name in _UNITS:
            measure, size = _UNITS[name]
            return measure, size * scale
    return f"count of {names[0].rstrip('s')}", scale


def _last_match(
    pattern: re.Pattern[str], text: str, end: int, start: int = 0
) -> re.Match[str] | None:
    """The last match of `pattern` in `text[start:end]`, in one pass (a lazy `.*?` search from
    each candidate start would rescan the rest of the text for each)."""
    last = collections.deque(pattern.finditer(text, start, end), maxlen=1)
    return last[0] if last else None


def _gsm8k(text: str) -> str | None:
    # The answer line is among the last few `####` lines (headings after it are few): checking
    # every line of a completion made of thousands would cost milliseconds each.
    for match in reversed(_GSM8K_RE.findall(text)[-GSM8K_LINES:]):
        answer = match.strip()
        if stated_number(answer) is not None or _NUMBER_LIST_RE.fullmatch(answer[:100]):
            return answer
        first = _LEADING_NUMBER_RE.match(answer)
        if first is not None and _another_number(answer[first.end() : first.end() + 200]):
            return answer  # `#### 18 (or 19)`: hedged, read whole, not an earlier line's number
    return None


def _stated_answer(text: str) -> str | None:
    """The math of the completion's last "The final answer is $...$" (or "answer: $...$"), as
    Minerva-style prompts ask for it, else the number of its last "The answer is 18": read in
    the completion's tail only."""
    tail = max(0, len(text) - TAIL_CHARS)
    found = _last_match(_STATED_ANSWER_RE, text, len(text), tail)
    # dollars are money as often as math: "is $18. Then $5" states 18, not the math "18. Then "
    stated = None if found is None else (found["math"] or found["inline"] or "").strip()
    if stated and looks_symbolic(stated):
        rest = _LINE_RE.match(text, found.end())[0]  # type: ignore[index]
        if _other_form(stated, rest):
            return stated
        # "$3$ or $4$", "$\frac{1}{2}$, approximately 0.7": read whole
        value = stated_number(stated)
        if (
            _QUALIFIED_RE.match(rest)
            or _another_number(rest, value)
            or _APPROXIMATION_RE.match(rest)
        ):
            return f"{stated}{_SENTENCE_END_RE.split(rest, maxsplit=1)[0]}".strip()
        return stated
    found = _last_match(_ANSWER_NUMBER_RE, text, len(text), tail)
    if found is not None:
        retracted = _RETRACTED_RE.match(text, found.end("number"))
        stated = stated_number(found["number"])
        if retracted is not None and retracted["line"] is not None and retracted["unit"]:
            unit = found["rest"].split("\n", 1)[0].split()[:1]
            if [w.lower() for w in unit] != retracted["unit"].lower().split()[:1]:
                retracted = None  # the same quantity in another unit on the next line
        if retracted is not None and any(
            stated_number(n) != stated for n in _NUMBER_RE.findall(retracted["after"])
        ):
            return None  # the statement taken back: what follows says what the answer is
        word = _FIRST_WORD_RE.match(found["rest"])
        changes = word is not None and (
            word[1].lower() in NOT_UNITS - _QUESTION_UNITS
            or (len(word[1]) == 1 and word[1] not in UNIT_LETTERS and word[1] != "a")
        )
        changes = changes and not _TIME_OF_DAY_RE.match(found["rest"])
        near = _NEAR_NUMBER_RE.match(found["rest"])
        hedged = _QUALIFIED_RE.match(found["rest"]) or (
            near is not None and stated_number(near["other"]) != stated
        )
        if not hedged and _UNIT_HEDGE_RE.match(found["rest"]):
            hedged = _unit_hedged(found["number"], found["rest"])
        elif not hedged:
            hedged = _another_number(found["rest"], stated)
        if not hedged and not changes:
            return found["number"]
        # "18 or 26", "18 squared": the sentence states no one number; matching judges it whole;
        # a worked sum states its result ("48 + 24 = 72", as `_whole_math` reads one)
        sentence = _SENTENCE_END_RE.split(found["rest"], maxsplit=1)[0]
        whole = f"{found['number']}{sentence}".strip()
        worked = _WORKED_SUM_RE.fullmatch(whole)
        if worked is None or _sum_value(worked["sum"]) != stated_number(worked["result"]):
            return whole  # no sum, or a false one: no one result
        return worked["result"]
    found = _ANSWER_WORD_RE.search(text, tail)
    return None if found is None else found["word"]


def _sum_value(text: str) -> Fraction | None:
    """The value of `text`, numbers joined by + - × ÷ (`_WORKED_SUM_RE`'s sum), the products
    first; None for a division by zero."""
    total = Fraction(0)
    for sign, term in re.findall(r"([-−+]?)([^-−+]+)", text.replace(",", "")):
        parts = re.split(r"([*/×·÷])", term)
        value = Fraction(parts[0].strip())
        for operator, operand in zip(parts[1::2], parts[2::2], strict=True):
            number = Fraction(operand.strip())
            if operator in "/÷" and number == 0:
                return None
            value = value / number if operator in "/÷" else value * number
        total += -value if sign in ("-", "−") else value
    return total


def _another_number(rest: str, value: Fraction | None = None) -> bool:
    """Whether the rest of a stated answer's sentence offers a second answer or changes it
    (`_SECOND_ANSWER_RE`, `_STRONG_HEDGE_RE`, `_ALSO_ANSWER_RE`, `_OR_AFTER_CLAUSE_RE`); a number
    the last two offer that is the stated `value` restates it."""
    sentence = _SENTENCE_END_RE.split(rest, maxsplit=1)[0]
    if _SECOND_ANSWER_RE.match(sentence) or _STRONG_HEDGE_RE.search(sentence):
        return True
    for also in _ALSO_ANSWER_RE.finditer(sentence):
        words = (also["words"] or "").lower().split()
        if all(w in _SAYING_WORDS for w in words) and _another_value(also["other"], value):
            return True
    clause = _OR_AFTER_CLAUSE_RE.search(sentence)
    return clause is not None and _another_value(clause["other"], value)


def _another_value(number: str, value: Fraction | None) -> bool:
    """Whether the number written `number` is not the stated `value` (None: any number is)."""
    return value is None or stated_number(number) != value


def _other_form(math_text: str, rest: str) -> bool:
    """Whether `rest`, after the stated math `math_text`, gives it again approximately or in another
    form (`_APPROXIMATION_RE`; `$\\frac{1}{2}$ (or 50%)`, the same value)."""
    value = stated_number(math_text)
    near = _APPROXIMATION_RE.match(rest)
    if near:
        sentence = _SENTENCE_END_RE.split(rest, maxsplit=1)[0]
        said = _NUMBER_RE.search(sentence, near.end())
        if said is not None and _another_number(sentence[said.end() :]):
            return False  # `$\frac{1}{2}$, about 0.5, or maybe $\frac{2}{3}$`
        said_equal = "=" in near[0]
        return value is None or said is None or _rounds_to(said[0], value, said_equal)
    other = _OTHER_FORM_RE.match(_SENTENCE_END_RE.split(rest, maxsplit=1)[0])
    if other is None or value is None:
        return False
    found = stated(other["other"])
    if found is None:
        return False
    return (found[0] / 100 if found[1] else found[0]) == value


def _rounds_to(shown: str, value: Fraction, said_equal: bool = False) -> bool:
    """Whether the number written `shown` is `value` rounded to the decimals it shows (`0.33`
    for 1/3; not `0.7` for 1/2, nor `4` for 3); a fraction (`2/3`) is no rounding, nor a
    decimal said equal (`= 0.8`) to a value whose decimals end (3/4 is 0.75)."""
    number = stated_number(shown)
    if number is None:
        return False
    if "/" in shown or "frac" in shown or (said_equal and _terminates(value)):
        return number == value
    places = len(shown.partition(".")[2])
    return abs(number - value) <= Fraction(1, 2 * 10**places)


def _terminates(value: Fraction) -> bool:
    """Whether `value`'s decimals end: its denominator has no prime factor but 2 and 5."""
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator == 1


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
    sides = EQUALS_RE.split(exact)
    lhs = sides[0]
    named = len(sides) == 2 and LHS_RE.match(exact)
    in_variables = len(sides) == 2 and re.search(r"[a-zA-Z]", COMMAND_RE.sub("", lhs))
    in_variables = in_variables and re.search(r"[-+]", lhs.strip().lstrip("-+"))
    side = exact.strip() if named or in_variables else sides[-1].strip()
    if not side or not looks_symbolic(side) or re.search(r"[-+*/=^_\\]\s*$", side):
        return None
    return side


def _whole_math(text: str) -> str | None:
    """A completion that is one short piece of math and nothing else (`\\frac{\\sqrt{505}}{7}`,
    a matrix laid out over lines), whole: its last number would be a denominator, an exponent or
    a matrix's last entry; of one worked sum without letters (`2 + 8 = 10`), the result it
    states, as `_final_math` reads the sum in a sentence. A line break outside an environment
    (`\\begin{bmatrix}...\\end{bmatrix}`) ends the piece: lines are steps, not one answer."""
    math_text = text.strip().strip("$").strip()
    if not math_text or not looks_symbolic(math_text):
        return None  # first: environments' spans are then looked for in short text only
    words = re.search(r"[a-zA-Z]{2,}|[,;]", COMMAND_RE.sub("", ENVIRONMENT_RE.sub("", math_text)))
    if words or "\n" in _ENVIRONMENT_SPAN_RE.sub(" ", math_text):
        return None  # "11H = 88000, so H = 8000.": a sentence, not one piece of math
    sides = EQUALS_RE.split(math_text)
    if len(sides) == 2 and not re.search(r"[a-zA-Z]", COMMAND_RE.sub("", sides[0])):
        return _math_answer(math_text)
    return math_text if re.search(r"[\\^/()+*=]|\d\s*[a-zA-Z]", math_text) else None


def _last_number(text: str) -> str | None:
    """The last number of `text`; None when it ends a hedge or is denied (`4 or 3`, `not 18`,
    `18 is wrong`: `_HEDGE_RE`, `_DENIED_RE`)."""
    found = _last_match(_NUMBER_RE, text, len(text))
    if found is None:
        return None
    before = max(0, found.start() - 40)
    hedge = _HEDGE_RE.search(text, before, found.start())
    if (
        hedge is not None
        and hedge["to"]
        and _CHANGE_TO_RE.search(text, before, found.start())
        and not _SPAN_RE.search(text, max(0, found.start() - 80), found.start())
    ):
        hedge = None  # `from 12 to 18`: a change, no range
    if hedge is not None or _OPERAND_RE.match(text, found.end()):
        return None
    power = _last_match(_POWER_AFTER_RE, text, len(text), found.end())
    if power is not None:
        start = max(0, power.start() - 40)
        if _HEDGE_RE.search(text, start, power.start()) or _JOINED_BEFORE_RE.search(
            text, start, power.start()
        ):
            return None
    if _DENIED_RE.match(text, found.end()):
        return None
    if found.group()[0].isdigit() and _SPACED_SIGN_RE.search(text, before, found.start()):
        return f"-{found.group()}"  # `is - 4`
    return found.group()
