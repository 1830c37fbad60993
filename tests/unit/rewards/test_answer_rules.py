"""What strict `correct` pays for: a stated, simplified answer equal to the reference, and nothing
else. Each row is (prompt, completion, gold, expected score): the question's undone work in any
notation (its expression reordered too), a conversion question's own literal, a decimal for an
exact gold, dressing that changes the value or is not an answer, a stated number hedged,
changed or denied by the rest of its sentence, two boxes offered together, and malformed golds
(unscored: None); beside them the stated answers that must still be paid, in the forms instruct
models write."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch

from oncurve.envs import PythonToolEnv
from oncurve.loop.evaluate import evaluate
from oncurve.rewards.math import has_math_verify
from oncurve.rewards.registry import answer_match_reward
from oncurve.rollout import SamplingParams

SIMPLIFY = "Simplify $\\sqrt{12}$."
EXPAND = "Expand $(x+1)^2$."
FACTOR = "Factor $x^2+2x+1$."
RATIONAL = "Simplify $\\frac{x^2-1}{x-1}$ for $x \\neq 1$."
TO_FRACTION = "Express 0.75 as a common fraction."
TO_DECIMAL = "Express $\\frac{7}{8}$ as a decimal."
PERCENT = "What percent of the class passed?"
W = "She sells 16 - 3 - 4 = 9 eggs at $2 each, so she makes 9 * 2 = $18.\n"


def case(prompt: str, completion: str, gold: str | None, expected: float | None) -> object:
    return pytest.param(prompt, completion, gold, expected, id=f"{completion!r} ~ {gold!r}")


# fmt: off
# The question's work left undone, written in another notation than the prompt's: not paid.
UNDONE = [
    case(SIMPLIFY, "\\boxed{\\sqrt[2]{12}}", "2\\sqrt{3}", 0.0),
    case(SIMPLIFY, "\\boxed{12^{1/2}}", "2\\sqrt{3}", 0.0),
    case(SIMPLIFY, "\\boxed{12^{\\frac{1}{2}}}", "2\\sqrt{3}", 0.0),
    case(SIMPLIFY, "\\boxed{\\sqrt{11+1}}", "2\\sqrt{3}", 0.0),
    case(SIMPLIFY, "\\boxed{\\sqrt{4 \\cdot 3}}", "2\\sqrt{3}", 0.0),
    case("Simplify sqrt(12).", "\\boxed{\\sqrt{12}}", "2\\sqrt{3}", 0.0),
    case("Simplify sqrt(12).", "\\boxed{sqrt(12)}", "2\\sqrt{3}", 0.0),
    case("What is $\\sqrt{48}$ in simplest form?", "\\boxed{2\\sqrt{12}}", "4\\sqrt{3}", 0.0),
    case(EXPAND, "\\boxed{(x+1)(x+1)}", "x^2+2x+1", 0.0),
    case(EXPAND, "\\boxed{(1+x)^2}", "x^2+2x+1", 0.0),
    case(EXPAND, "\\boxed{(x+1)^{2}}", "x^2+2x+1", 0.0),
    case(RATIONAL, "\\boxed{(x^2-1)/(x-1)}", "x+1", 0.0),
    case(RATIONAL, "\\boxed{\\frac{(x-1)(x+1)}{x-1}}", "x+1", 0.0),
    case(FACTOR, "\\boxed{1+2x+x^2}", "(x+1)^2", 0.0),
    case(FACTOR, "\\boxed{x^2+2x+1}", "(x+1)^2", 0.0),
    case(TO_FRACTION, "\\boxed{0.75}", "\\frac{3}{4}", 0.0),
    case(TO_FRACTION, "\\boxed{\\frac{75}{100}}", "\\frac{3}{4}", 0.0),
    case(TO_DECIMAL, "\\boxed{\\frac{7}{8}}", "0.875", 0.0),
    case(TO_DECIMAL, "\\boxed{7/8}", "0.875", 0.0),
    # a decimal approximation for an exact gold, symbolic or numeric alike
    case("p", "\\boxed{3.4641016151377544}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{3.464}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{0.6931471805599453}", "\\ln 2", 0.0),
    case("p", "\\boxed{0.333333}", "\\frac{1}{3}", 0.0),
    case("p", "\\boxed{3.14159}", "\\pi", 0.0),
    # dressing that changes the value, or is not an answer
    case("p", "\\boxed{0.75\\%}", "0.75", 0.0),
    case("p", "\\boxed{5 \\text{ thousand}}", "5", 0.0),
    case("p", "\\boxed{5 \\text{ million}}", "5", 0.0),
    case("p", "\\boxed{5 \\text{ is not the answer}}", "5", 0.0),
    case("p", "<answer>not 5</answer>", "5", 0.0),
    case("p", "\\boxed{\\delta}", "\\Delta", 0.0),
    case("p", "\\boxed{x = 2x + 3}", "y=2x+3", 0.0),
    case("p", "\\boxed{1 = 2 = 3 = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{1 = 2 = 18}", "18", 0.0),
    case("What is 2 + 8?", "10 = 2 + 8", "10", 0.0),
    case("p", "1 = 2 = 10", "10", 0.0),
    case("p", "The temperature fell to −4 degrees.", "4", 0.0),
    # the last number of an unboxed completion: a hedge, or a fraction's denominator
    case("p", "So it is 4 or 3.", "3", 0.0),
    case("p", "The share is \\frac{3}{4}.", "4", 0.0),
    # "The answer is N" followed by what changes N, hedges or corrects it
    *(case("p", f"The answer is 18{rest}", "18", 0.0) for rest in (
        " squared.", "^2.", "!", " factorial.", " + 1.", " × 2.", " / 2.", " hundred.", " k.", " thousandths.", " percent.", "%.", " (or 19).", ", or possibly 19.",
        " to 20.", "-20.", " ± 3.", " (wrong).", " — no, 19.", ", 19.", " and 19.")),
    # a negation or a hedge in the sentence of the last number
    case("p", "The answer is not 18.", "18", 0.0),
    case("p", "It is not 18.", "18", 0.0),
    case("p", "18 is wrong.", "18", 0.0),
    case("p", "It can't be 18.", "18", 0.0),
    case("p", "19 or maybe 18", "18", 0.0),
    case("p", "It is 19, or perhaps 18", "18", 0.0),
    case("p", "It is 19 vs 18.", "18", 0.0),
    case("p", "x = 17 or x = 18", "18", 0.0),
    case("p", "The answer is between 17 and 18.", "18", 0.0),
    # two boxed answers offered together
    case("p", "The sum is $\\boxed{50}$ or $\\boxed{18}$ depending on the sign convention.",
         "18", 0.0),
    case("p", "Either \\boxed{19} or \\boxed{18}.", "18", 0.0),
    case("p", "\\boxed{17} \\boxed{18}", "18", 0.0),
    # words after a boxed number that change or deny it, and `\not=`
    *(case("How many apples?", f"\\boxed{{18 \\text{{ {word}}}}}", "18", 0.0) for word in (
        "factorial", "k", "grand", "below zero", "incorrect", "wrong", "at least", "doubled",
        "reciprocal", "lakh", "hundredths", "percent")),
    case("p", "\\boxed{\\not= 18}", "18", 0.0),
    case("p", "$x \\not= 18$", "18", 0.0),
    case("p", "The answer is $\\not= 18$.", "18", 0.0),
    # a conversion question's own literal: a repeating decimal, a percentage, a quotient
    case("Express $0.\\overline{36}$ as a common fraction in lowest terms.",
         "\\boxed{0.\\overline{36}}", "\\frac{4}{11}", 0.0),
    case("Express 75% as a common fraction.", "\\boxed{0.75}", "\\frac34", 0.0),
    case("Express 75% as a common fraction.", "\\boxed{75\\%}", "\\frac34", 0.0),
    case(TO_FRACTION, "\\boxed{75\\%}", "\\frac{3}{4}", 0.0),
    case("Express $7 \\div 8$ as a decimal.", "\\boxed{\\frac{7}{8}}", "0.875", 0.0),
    case(TO_DECIMAL, "\\boxed{87.5\\%}", "0.875", 0.0),
    # the question's expression reordered or renotated
    case("Compute $\\sin^2 x + \\cos^2 x + x$.", "\\boxed{x+\\sin^2 x+\\cos^2 x}", "1+x", 0.0),
    case("Simplify $\\sqrt{2}\\cdot\\sqrt{6}$.", "\\boxed{\\sqrt{6}\\sqrt{2}}", "2\\sqrt{3}",
         0.0),
    case("Compute $\\log_2 8 + \\pi$.", "\\boxed{\\pi + \\log_2 8}", "3+\\pi", 0.0),
    case("Simplify $\\frac{4\\sqrt{3}}{2}$.", "\\boxed{4\\sqrt{3}/2}", "2\\sqrt{3}", 0.0),
    case("What is $\\cos\\frac{\\pi}{6}$?", "\\boxed{\\cos(\\pi/6)}", "\\frac{\\sqrt{3}}{2}", 0.0),
    # symbolic answers left unsimplified
    *(case(SIMPLIFY, f"\\boxed{{{answer}}}", "2\\sqrt{3}", 0.0) for answer in (
        "\\frac{4\\sqrt{3}}{2}", "\\sqrt{3}+\\sqrt{3}", "3\\sqrt3-\\sqrt3", "\\sqrt{2}\\sqrt{6}",
        "2\\sqrt{3}+0")),
    case(EXPAND, "\\boxed{x^2+x+x+1}", "x^2+2x+1", 0.0),
    *(case("p", f"\\boxed{{{answer}}}", "9\\pi", 0.0) for answer in (
        "\\frac{18\\pi}{2}", "3^2\\pi", "10\\pi-\\pi", "\\ln(e^9)\\pi")),
    *(case("p", f"\\boxed{{{answer}}}", "x+1", 0.0) for answer in (
        "x+\\log_2 2", "x+e^0", "x+1^2", "x + \\sin^2 x + \\cos^2 x")),
    case("p", "\\boxed{\\frac{6\\pi}{4}}", "\\frac{3\\pi}{2}", 0.0),
    case("p", "\\boxed{\\frac{2\\sqrt{3}}{4}}", "\\frac{\\sqrt3}{2}", 0.0),
    *(case("p", f"\\boxed{{{answer}}}", "6+9i", 0.0) for answer in (
        "(2+3i)\\cdot 3", "(2+3i)3", "\\frac{12+18i}{2}")),
    # a digit that is no decimal digit (a superscript, a circled one) where a number is read
    case("p", "\\boxed{\\sqrt{²}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{\\sqrt ³}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{\\frac{\\sqrt{3}}{²}}", "\\frac{\\sqrt{3}}{2}", 0.0),
    case("p", "\\boxed{\\frac{1}{①}}", "\\frac{\\sqrt{3}}{2}", 0.0),
    # digits split by a space that is no thousands separator
    case("p", "\\boxed{1 8}", "18", 0.0),
    case("p", "\\boxed{10 00}", "1000", 0.0),
    case("p", "The answer is 1 8.", "18", 0.0),
    # an equation whose left side is no name: a false equation, or a hedge before its last part
    case("p", "\\boxed{1 = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{\\sqrt{3} = \\sqrt{2}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{3\\sqrt{2} \\text{ or } y = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{x = 3\\sqrt{2} \\text{ or } x = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{y = 3x + 2 \\text{ or } y = 2x+3}", "y = 2x+3", 0.0),
    case("p", "\\boxed{B = C}", "(C)", 0.0),
    case("p", "\\boxed{18 = 18}", "18", 0.0),
    # a stated number hedged after its unit, or in the next sentence
    case("p", "The answer is 18 apples (or 19).", "18", 0.0),
    case("p", "The answer is 18 apples or 19 apples.", "18", 0.0),
    case("p", "The answer is 18 apples, or maybe 19.", "18", 0.0),
    case("p", "The answer is 18. Or 19.", "18", 0.0),
    case("p", "The answer is 18. Or 19.", "19", 0.0),
    case("p", "The answer is 18. Actually, it is 19.", "18", 0.0),
    case("p", "The answer is 18 apples or 19 apples.", "19", 0.0),
    case("p", "\\boxed{(1) = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{2x = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{1\\text{ cm} = 2\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{\\pi 1 8}", "18\\pi", 0.0),
    case(
        "There is a 30% chance of rain tomorrow. What is the probability that it does not rain?",
        "\\boxed{0.7\\%}", "0.7", 0.0,
    ),
    case("A 20% tip on a $50 bill. What is the tip in dollars?", "\\boxed{10\\%}", "10", 0.0),
    case("p", "The answer is 18 dollars or 19 dollars total.", "18", 0.0),
    case("p", "The answer is 18 dollars (or 19 with tax).", "18", 0.0),
    case("p", "The answer is 18 dollars, or 36 dollars if she sells twice.", "18", 0.0),
    case("p", "The answer is 18. Actually, I think it's 19.", "18", 0.0),
    case("p", "The answer is 18. Wait, that's wrong: it should be 19.", "18", 0.0),
    case("p", "The answer is 18. No, the correct answer is 19.", "18", 0.0),
    case("p", "The answer is 18. Correction: the total is 19.", "18", 0.0),
    case("p", "```python\nanswer = (16 - 3 - 4) * 2\nprint(answer)  # 18", "18", 0.0),
    case("p", "```\nresult = 16 - 3 - 4\nprint(result * 2)\n```\nI give up.", "18", 0.0),
    case("p", "The answer is 18. Rather, $19.", "18", 0.0),
    case("p", "The answer is 18 apples or 19 oranges.", "18", 0.0),
    case("p", "The answer is 18 eggs or 36 dollars.", "18", 0.0),
    case("p", "The answer is 10 cups and/or 5 bowls.", "10", 0.0),
    case("p", "The answer is 18. Or maybe it's 19.", "18", 0.0),
    case("p", "The answer is 18. Actually, she makes 19.", "18", 0.0),
    case("p", "The answer is 18. But wait, she also sells 2 more, so 22.", "18", 0.0),
    case("p", "```\nconsole.log(18)\n```\nI could not solve it.", "18", 0.0),
    case("p", "```\nresult = 18\n```\nI could not solve it.", "18", 0.0),
    case("p", "```\n>>> (16-3-4)*2\n18\n```\nI could not solve it.", "18", 0.0),
    case("p", "<think>She sells 9 eggs; 9 * 2 = 18 dollars. Hmm, but wait</think>", "18", 0.0),
    case("p", "```python\nprint('#### 19')\n```\nThe answer is 18.", "19", 0.0),
    case("p", "```python\nprint(18)\n```\nI could not solve it.", "18", 0.0),
    case("p", "She makes 9 * 2 dollars.\n```python\nprint(18)\n```", "18", 0.0),
    # arithmetic on written numbers left undone, a product of a bracket and a letter
    case("p", "\\boxed{(5-3)\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("p", "\\boxed{x+5\\cdot 4-19}", "x+1", 0.0),
    case("p", "\\boxed{x+6/2-2}", "x+1", 0.0),
    case("p", "\\boxed{x+0!}", "x+1", 0.0),
    case("p", "\\boxed{x+\\binom{5}{0}}", "x+1", 0.0),
    case("p", "\\boxed{(x+1)x}", "x^2+x", 0.0),
    case("p", "\\boxed{\\frac{\\sqrt{3}}{1+1}}", "\\frac{\\sqrt{3}}{2}", 0.0),
    case("p", "\\boxed{\\frac{2\\sqrt{3}}{2\\cdot 2}}", "\\frac{\\sqrt{3}}{2}", 0.0),
    case("Simplify $\\sqrt3+\\sqrt3$.", "\\boxed{(1+1)\\sqrt{3}}", "2\\sqrt{3}", 0.0),
    case("Simplify $3x+1-2x$.", "\\boxed{(3-2)x+1}", "x+1", 0.0),
    case("p", "\\boxed{x^{2+1}}", "x^3", 0.0),
    # words or a notation that change the value, and a sum math-verify rounds to the gold
    case("p", "\\boxed{18 \\text{ divided by two}}", "18", 0.0),
    case("p", "\\boxed{18 \\text{ halves}}", "18", 0.0),
    case("p", "\\boxed{1800 \\times 10^{-2}}", "18", 0.0),
    case("p", "\\boxed{17.\\overline{9}}", "18", 0.0),
    case("What percent of 200 is 100?", "\\boxed{5000\\%}", "50", 0.0),
    case("p", "\\boxed{\\pi + \\frac{1}{100000000000000000}}", "\\pi", 0.0),
    case("p", "\\boxed{2\\sqrt{3}+\\frac{1}{100000000000000000}}", "2\\sqrt{3}", 0.0),
    # a conversion question's number restated in its own notation
    case("Express 2500 in scientific notation.", "\\boxed{2500}", "2.5 \\times 10^3", 0.0),
    case("Express 0.00045 in scientific notation.", "\\boxed{0.00045}", "4.5 \\times 10^{-4}", 0.0),
    case("Write $2.5 \\times 10^3$ in standard form.", "\\boxed{2.5 \\times 10^3}", "2500", 0.0),
    case("Express $\\frac{5}{2}$ as a mixed number.", "\\boxed{\\frac{5}{2}}", "2\\frac{1}{2}", 0.0),
    case("Write $2\\frac12$ as an improper fraction.", "\\boxed{2\\frac{1}{2}}", "\\frac52", 0.0),
    case("Express $3\\frac{1}{4}$ as a decimal.", "\\boxed{3\\frac{1}{4}}", "3.25", 0.0),
    case("Express 7 ÷ 8 as a decimal.", "\\boxed{\\frac{7}{8}}", "0.875", 0.0),
    case("Express 7 divided by 8 as a decimal.", "\\boxed{\\frac{7}{8}}", "0.875", 0.0),
    case("Express $0.\\overline3$ as a common fraction.", "\\boxed{0.\\overline{3}}", "\\frac{1}{3}", 0.0),
    # a later statement, a hedge after the closing `$`, two boxes joined by anything but prose
    case("p", "The answer is 71. The answer is 72.", "71", 0.0),
    case("p", "Answer: 71. Final answer: 72.", "71", 0.0),
    case("p", "The answer is $3$ or $4$.", "3", 0.0),
    case("p", "The final answer is $3$ or $4$.", "3", 0.0),
    *(case("p", completion, "72", 0.0) for completion in (
        "\\boxed{71} \\text{ or } \\boxed{72}", "\\boxed{71}, or \\boxed{72}",
        "\\boxed{71} or maybe \\boxed{72}", "\\boxed{71} \\quad \\boxed{72}",
        "\\boxed{71} vs \\boxed{72}", "\\boxed{71} (or \\boxed{72})",
        "It is \\boxed{71} if she counts all, otherwise \\boxed{72}.",
        "\\boxed{\\boxed{71} \\text{ or } \\boxed{72}}",
        "\\boxed{70} or \\boxed{71} or \\boxed{72}")),
    # another number later in the sentence, not after a reason; a retraction in the next one
    *(case("p", f"The answer is 3{rest}", "3", 0.0) for rest in (
        ", but actually 4.", " (if not 4).", ", though it might be 4.", " \\text{ or } 4",
        "; or 4.")),
    case("p", "The answer is 3,4.", "4", 0.0),
    case("p", "#### 3,4", "4", 0.0),
    *(case("p", f"The answer is 72.{rest}", "72", 0.0) for rest in (
        " Sorry, I meant 71.", " Never mind, 71.", " On second thought, 71.",
        "\nScratch that: 71.", " Alternatively, 71.", " It might be 71.")),
    case("p", "The answer is 72 unless she eats 2 more, then 71.", "72", 0.0),
    # a range said with from ... to, not a change
    *(case("p", completion, "20", 0.0) for completion in (
        "She makes anywhere from 18 to 20 dollars.", "The answer is somewhere from 18 to 20.",
        "It could go from 18 to 20 depending on the day.")),
    # stated math, then another value said equal or near it
    # an alternative written in LaTeX
    case("p", "The final answer is $\\frac{1}{2}$, or perhaps $\\frac{1}{3}$.", "1/2", 0.0),
    case("p", "The answer is 18, or maybe \\frac{1}{2}.", "18", 0.0),
    case("p", "The answer is $18, but actually $\\frac{37}{2}$.", "18", 0.0),
    case("p", "The final answer is $3$ = 4.", "3", 0.0),
    case("p", "The final answer is $\\frac{1}{2}$ = 0.6.", "1/2", 0.0),
    case("p", "The final answer is $\\frac{1}{2}$, approximately 0.7.", "1/2", 0.0),
    case("p", "The final answer is $\\frac{1}{3}$, approximately 0.33.", "1/3", 1.0),
    case("p", "The answer is 72, unless I misread and it's 71.", "72", 0.0),
    # the last number: a range, a hedge or a comparison
    *(case("p", completion, "4", 0.0) for completion in (
        "So she has 3 to 4 apples.", "So she has 3-4 apples.", "So she has 3 apples, possibly 4.",
        "The answer is at least 4.", "So she has more than 4 apples.", "So she has maybe 4.",
        "The answer is probably 4.", "I guess 4?", "She can buy up to 4.",
        "So she has under 4 apples.", "It costs over 4 dollars.", "It is below 4.",
        "It is nearly 4.", "She has almost 4 apples.", "She has 3 (or 4) apples.",
        "She has 3 apples or 4 apples.", "3 \u2014 or 4", "3 or else 4")),
    # a sign written with another dash
    *(case("p", completion, "4", 0.0) for completion in (
        "The answer is \u20134.", "#### \u20134", "The temperature is \u20124.",
        "The temperature is \ufe634.", "The answer is - 4.")),
    # a letter, a constant or a word after a number that changes its value
    *(case("p", f"\\boxed{{4 {dressing}}}", "4", 0.0) for dressing in (
        "i", "x", "e", "\\text{ pi}", "\\text{ negative}", "\\text{ billionths}", "\\text{ tens}",
        "\\text{ score}", "\\text{ twice}", "\\text{ more}", "\\text{ fewer}", "\\text{ pct}",
        "\\text{ basis points}", "\\text{ x}")),
    case("p", "The answer is 4\uff05.", "4", 0.0),
    # a power after a stated number, and an exponent read as the last number
    *(case("p", f"The answer is 4{rest}", "4", 0.0) for rest in ("\u00b2.", "e2.", " x 10^2.")),
    case("p", "The garden is 8 m by 6 m, so its area is 48 m^2.", "2", 0.0),
    case("p", "So the result is 4\u00d710^2.", "2", 0.0),
    case("p", "So the result is 4\u00d710^2.", "4", 0.0),
    case("p", "So the area is 5^2.", "2", 0.0),
    case("p", "So the area is 5^2.", "5", 0.0),
    # a mixed number's fraction is no answer of its own
    case("p", "It takes 1 1/2 hours.", "0.5", 0.0),
    # a hedge whose second number is a power: the earlier number is no answer either
    *(case("p", completion, "18", 0.0) for completion in (
        "Janet makes $18 a day, or maybe 2^{4} dollars.", "It is 18, or maybe 3\u00b2.",
        "So she makes 18 or 4e1 dollars.")),
    # a dash after a word that is no relation is a separator, not a minus
    case("p", "Final answer - 5", "-5", 0.0),
    case("p", "The change in temperature \u2013 5 degrees.", "-5", 0.0),
    # a retraction after a dash or an admitted error, and a hedged `####` line
    case("p", "The answer is 72. Sorry \u2014 I meant 71.", "72", 0.0),
    case("p", "The answer is 72. I made an error; it should be 71.", "72", 0.0),
    case("p", "#### 18 (or 19)", "19", 0.0),
    case("p", "#### 18 (or 19)", "18", 0.0),
    case("p", "#### 18\n#### 18 or 19", "18", 0.0),
    # arithmetic in words after a stated number, and hedges a later reason does not excuse
    *(case("p", f"The answer is 18{rest}", "18", 0.0) for rest in (
        " multiplied by 2.", " to the power of 2.", " less 2.", " mod 5.", " \u2248 19.",
        " if I'm not mistaken, else 19.", " dollars, but actually 19.", " (Janet) or 19 (Tom).")),
    case("p", "The answer is 3 C 2.", "3", 0.0),
    # two boxes offered together across display math, emphasis, "also", an aside, a sentence's
    # end before a hedge word, or a last box repeated
    *(case("p", completion, "72", 0.0) for completion in (
        "\\[\\boxed{71}\\] or \\[\\boxed{72}\\]", "\\boxed{\\frac{1}{2}} \\text{ or } \\boxed{72}",
        "\\boxed{71} or \\boxed{72} or \\boxed{72}", "\\boxed{71}. Alternatively, \\boxed{72}.",
        "\\boxed{71} and also \\boxed{72}",
        "\\boxed{71} or (depending on interpretation) \\boxed{72}",
        "\\boxed{71} \\textbf{ or } \\boxed{72}", "\\boxed{71}. Or \\boxed{72}.",
        "\\boxed{71}" + " or \\boxed{72}" * 40)),
    # a second number a later word offers as an answer too
    *(case("p", f"The answer is 18{rest}", "18", 0.0) for rest in (
        "; 19 is also acceptable.", " as well as 19.", ", which might actually be 19.",
        ", though 19 is also correct.", " (19 would also be right).")),
    case("p", "The final answer is $3$, with $4$ also possible.", "3", 0.0),
    # an approximation or a value said equal that is another number, after a stated one
    *(case("p", f"The answer is 18{rest}", "18", 0.0) for rest in (
        ", roughly 19.", ", or about 19.", ", approximately 19.", " (19).", " (19?).",
        ", unless 19.", "; could be 19.", ", failing that 19.", " (19 instead if she eats two).",
        " if she sells all, or 19.", " since 9 \u00d7 2 = 18, or 20.", ", up from 16, or 19.",
        "\nor 19.", ". Maybe 19.", ". Perhaps 19 though.")),
    case("p", "The final answer is $\\frac{3}{4}$ = 0.8.", "\\frac{3}{4}", 0.0),
    case("p", "The final answer is $\\frac{1}{2}$, or roughly $\\frac{2}{3}$.", "\\frac{1}{2}", 0.0),
    case("p", "The final answer is $\\frac{1}{2}$, about 0.5, or maybe $\\frac{2}{3}$.",
         "\\frac{1}{2}", 0.0),
    case("p", "The final answer is $\\frac{1}{2}$, equivalently 2/3.", "\\frac{1}{2}", 0.0),
    case("p", "It is $\\boxed{19}$. Or it is $\\boxed{18}$.", "18", 0.0),
    # the last number an approximation, or one near another
    case("p", "She makes 18, roughly 19.", "19", 0.0),
    case("p", "I'd guess around 18 or so.", "18", 0.0),
    # a worked sum after another number, or a false one, states no result
    case("p", "The answer is 20, 9 \u00d7 2 = 18.", "18", 0.0),
    case("p", "The answer is 18 + 2 = 18.", "18", 0.0),
    case("p", "\\boxed{\\text{wrong} = 4}", "4", 0.0),
    # a second answer after a reason and a condition of its own, on a next line after "or
    # perhaps" or in the same unit, and a list, a plus-or-minus or an unbracketed pair for a
    # pair or an interval
    *(case("p", f"The answer is 18{rest}", "18", 0.0) for rest in (
        " if she sells all of them, or 16 if two break.", " since 9 \u00d7 2 = 18, or 20 if she sells 10.",
        "\n\nor perhaps 20.", " eggs\nor 20 eggs.")),
    case("p", "The answer is 540 meters\nor 600 meters.", "540", 0.0),
    case("p", "The answer is $\\boxed{1, 3}$.", "(1,3)", 0.0),
    case("p", "The solution is $\\boxed{x = \\pm 2}$.", "(-2,2)", 0.0),
    case("p", "The range is $\\boxed{0, \\infty}$.", "(0,\\infty)", 0.0),
    # another number near a stated one after its unit, or after "i.e.", "which is", "close to"
    *(case("p", f"The answer is 18{rest}", "18", 0.0) for rest in (
        " dollars, roughly 20.", " dollars (20?).", ", i.e. about 20.", ", which is about 20.",
        ", close to 20.", " (approx. 20).")),
    # a constant, a fraction or a scale written right after the number
    case("p", "The answer is 2\u03c0.", "2", 0.0),
    case("p", "She needs 2\u00bd cups.", "2", 0.0),
    case("p", "The answer is 18 bn.", "18", 0.0),
    case("p", "The answer is 18 mn.", "18", 0.0),
    # a list or a hedge for an ordered pair or an interval, and values apart by a tiny amount
    case("p", "\\boxed{3 \\text{ or } 4}", "(3, 4)", 0.0),
    case("p", "\\boxed{\\{1, 2\\}}", "(1,2)", 0.0),
    case("p", "\\boxed{3, 4}", "[3, 4]", 0.0),
    case("p", "\\boxed{2^{-60}}", "2^{-61}", 0.0),
    case("p", "\\boxed{\\sqrt{2}\\cdot 2^{-60}}", "\\sqrt{3}\\cdot 2^{-60}", 0.0),
    case("p", "\\boxed{10^{-20}}", "0", 0.0),
    # a zero added as a hedge (`\pm 0`), or a function still to evaluate: work undone
    case("p", "\\boxed{\\pi \\pm 0}", "\\pi", 0.0),
    case("p", "\\boxed{x \\mp 0}", "x", 0.0),
    case("p", "\\boxed{1+\\sqrt{2} \u00b1 0}", "1+\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\max(1+\\sqrt{2}, 1-\\sqrt{2})}", "1+\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\min(1+\\sqrt{2}, 3)}", "1+\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\gcd(2,4)\\sqrt{2}}", "2\\sqrt{2}", 0.0),
    case("p", "\\boxed{|-2|\\sqrt{2}}", "2\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\left|1-\\sqrt{2}\\right|}", "\\sqrt{2}-1", 0.0),
    case("p", "\\boxed{\\det\\begin{pmatrix}2\\end{pmatrix}\\sqrt{2}}", "2\\sqrt{2}", 0.0),
    case("p", "\\boxed{x+\\ln e}", "x+1", 0.0),
    case("p", "\\boxed{\\sqrt{2}\\ln e}", "\\sqrt{2}", 0.0),
    # a box, then another answer stated after it: the box was a step, or a hedge
    case("p", "\\boxed{46}. The answer is 47.", "46", 0.0),
    case("p", "\\boxed{46}\n**Answer:** 47", "46", 0.0),
    case("p", "\\boxed{46}\n\nFinal answer: 47", "46", 0.0),
    case("p", "\\boxed{46}\n#### 47", "46", 0.0),
    case("p", "\\boxed{\\frac{1}{2}}\n\nThe answer is 2.", "\\frac{1}{2}", 0.0),
    case("p", "\\boxed{2\\sqrt{3}}. The answer is 3.", "2\\sqrt{3}", 0.0),
    # tags, then another answer stated after them: the last statement is the answer
    case("p", "<answer>46</answer> then \\boxed{47}", "46", 0.0),
    case("p", "<answer>46</answer>\n\nThe answer is 47.", "46", 0.0),
    case("p", "<answer>46</answer>\n#### 47", "46", 0.0),
    # a choice's letter stated after a boxed one
    case("p", "\\boxed{B}. The answer is C.", "B", 0.0),
    case("p", "\\boxed{(B)}\n\n**Answer:** (C)", "(B)", 0.0),
    case("p", "<answer>B</answer> The answer is C.", "B", 0.0),
    # a list or a set that repeats a member: the same answer twice is not simplified
    case("p", "\\boxed{\\{\\sqrt{2}, \\sqrt{2}, 1\\}}", "\\{1, \\sqrt{2}\\}", 0.0),
    case("p", "\\boxed{\\sqrt{2} \\text{ or } \\sqrt{2}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\pi, \\pi}", "\\pi", 0.0),
    case("p", "\\boxed{x^2+1, x^2+1}", "x^2+1", 0.0),
    case("p", "\\boxed{\\{1, 1, 2\\}}", "\\{1, 2\\}", 0.0),
    case("p", "\\boxed{1,000, 1,000}", "1,000", 0.0),
    # an operation that changes nothing left in: times, over or to the power one, a power zero,
    # two signs
    case("p", "\\boxed{\\sqrt{2}\\cdot 1}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{1 \\cdot \\sqrt{2}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{1\\sqrt{2}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\sqrt{2}/1}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\frac{\\sqrt{2}}{1}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\sqrt{2}^{1}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{\\sqrt{2}\\cdot \\pi^0}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{--\\sqrt{2}}", "\\sqrt{2}", 0.0),
    case("p", "\\boxed{-(-\\sqrt{2})}", "\\sqrt{2}", 0.0),
    # arithmetic left in a matrix's entries, before a row break or the matrix's end
    case("p", "\\boxed{\\begin{pmatrix}2-1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 0.0),
    case("p", "\\boxed{\\begin{pmatrix}1\\\\3-1\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 0.0),
    # digits split by a LaTeX space that groups no thousands
    case("p", "\\boxed{4\\,6}", "46", 0.0),
    case("p", "\\boxed{4\\;6}", "46", 0.0),
    case("p", "\\boxed{4\\ 6}", "46", 0.0),
    case("p", "\\boxed{1\\,00}", "100", 0.0),
    case("p", "\\boxed{1\\,2345}", "12345", 0.0),
]

# Malformed golds are not scored: a policy repeating them learns nothing true.
MALFORMED_GOLDS = [
    case("p", "\\boxed{NaN}", "NaN", None),
    case("p", "\\boxed{nan}", "nan", None),
    case("p", "\\boxed{None}", "None", None),
    case("p", "\\boxed{0/0}", "0/0", None),
    case("p", "\\boxed{\\frac{0}{0}}", "\\frac{0}{0}", None),
    case("p", "\\boxed{}", "", None),
    case("p", "\\boxed{1}", None, None),
]

# Stated, simplified answers in the forms instruct models write: paid.
STATED = [
    case(SIMPLIFY, "\\boxed{2\\sqrt{3}}", "2\\sqrt{3}", 1.0),
    case(SIMPLIFY, "\\boxed{2 \\sqrt 3}", "2\\sqrt{3}", 1.0),
    case(EXPAND, "\\boxed{x^2+2x+1}", "x^2+2x+1", 1.0),
    case(EXPAND, "\\boxed{1+2x+x^2}", "x^2+2x+1", 1.0),
    case(FACTOR, "\\boxed{(x+1)^2}", "(x+1)^2", 1.0),
    case(FACTOR, "\\boxed{(1+x)^2}", "(x+1)^2", 1.0),
    case(RATIONAL, "\\boxed{x+1}", "x+1", 1.0),
    case(TO_FRACTION, "\\boxed{\\frac{3}{4}}", "\\frac{3}{4}", 1.0),
    case(TO_FRACTION, "\\boxed{\\dfrac34}", "\\frac{3}{4}", 1.0),
    case(TO_DECIMAL, "\\boxed{0.875}", "0.875", 1.0),
    case("p", "\\boxed{\\ln 2}", "\\ln 2", 1.0),
    case("p", "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
    case("p", "\\boxed{\\Delta}", "\\Delta", 1.0),
    case("p", "\\boxed{y = 2x + 3}", "y=2x+3", 1.0),
    case("p", "\\boxed{2x+3}", "y=2x+3", 1.0),
    case("p", "\\boxed{0.75}", "\\frac{3}{4}", 1.0),
    case("p", "\\boxed{0.\\overline{3}}", "\\frac{1}{3}", 1.0),
    case("p", "\\boxed{75\\%}", "0.75", 1.0),
    case(PERCENT, "\\boxed{75\\%}", "75", 1.0),
    case(PERCENT, "\\boxed{75 \\text{ percent}}", "75", 1.0),
    case("p", "\\boxed{18\\text{ m}^2}", "18", 1.0),
    case("p", "\\boxed{18 \\text{ cm}^{2}}", "18", 1.0),
    case("p", "\\boxed{(-18)}", "-18", 1.0),
    case("p", "\\boxed{AB = 18}", "18", 1.0),
    case("p", "\\boxed{x_1 = 18}", "18", 1.0),
    case("p", "\\boxed{1.5 \\times 10^3}", "1500", 1.0),
    case("p", "\\boxed{1.5 \\cdot 10^{3}}", "1500", 1.0),
    case("p", "\\boxed{\\bm{18}}", "18", 1.0),
    case("p", "\\boxed{\\underline{18}}", "18", 1.0),
    case("p", "\\boxed{\\textnormal{18 apples}}", "18", 1.0),
    case("p", "The price is ¥18.", "18", 1.0),
    case("p", "\\boxed{₹18}", "18", 1.0),
    case("p", "\\boxed{7\\frac{1}{2}}", "\\frac{15}{2}", 1.0),
    case("p", "\\boxed{\\frac{2}{-3}}", "-\\frac{2}{3}", 1.0),
    case("p", "\\boxed{\\cfrac{3}{4}}", "0.75", 1.0),
    case("p", "\\boxed{32,\\! 349}", "32349", 1.0),
    case("p", "\\boxed{x=2 \\text{ or } x=3}", "2, 3", 1.0),
    case("p", "\\boxed{2 \\text{ and } 3}", "2,3", 1.0),
    case("p", "\\boxed{x=2}", "2, 3", 0.0),
    case("p", "<answer>The answer is 18.</answer>", "18", 1.0),
    case("Put your answer in \\boxed{}.", "So \\boxed{18}. (The format asks for \\boxed{}.)",
         "18", 1.0),
    case("p", "<answer>18</answer> in the <answer></answer> format", "18", 1.0),
    case("p", "Each piece is 25 / 2 = 12.5m.", "12.5", 1.0),
    case("p", "The temperature fell to −4 degrees.", "-4", 1.0),
    case("p", "The share is \\frac{3}{4}.", "0.75", 1.0),
    case("p", "In 2019 or so, we had 3 apples.", "3", 1.0),
    case("p", "Final Answer: The final answer is $\\frac{\\sqrt{3}}{2}$. I hope it is correct.",
         "\\frac{\\sqrt{3}}{2}", 1.0),
    case("p", "The answer is $18. Then he paid $5 for the bag.", "18", 1.0),
    case("p", "The answer is $18. Then he paid $5 for the bag.", "5", 0.0),
    case("p", "**Answer:** 1,080 apples", "1080", 1.0),
    # forms of the benchmark corpus (benchmarks/data/answer_corpus.jsonl) a checker must read
    case("p", "So the total is $400 + $60 = $460.\n\nThe answer is $\\$460$.", "460", 1.0),
    case("p", "**Answer:** 70 thousand dollars", "70000", 1.0),
    case("p", "**Answer:** 70 thousand dollars", "70", 0.0),
    case("p", "The answer is $1.45 million.", "1,450,000", 1.0),
    case("p", "She makes $18 or $26.\n\nThe answer is 18 or 26.", "18", 0.0),
    case("p", "After six turns she faces east.\n\nThe answer is East.", "\\text{east}", 1.0),
    case("p", "The points lie on a parabola.\n\nThe answer is (C).", "\\text{(C)}", 1.0),
    case("p", "**Answer:** B", "\\text{(B)}", 1.0),
    case("p", "**Answer:** B", "\\text{(C)}", 0.0),
    case("p", "The area is $9 \\pi$ square units.", "9\\pi", 1.0),
    case("p", "The integers are $n = 1$ and $n = -2$.", "1,-2", 1.0),
    case("p", "So $\\cos 30^\\circ = \\frac{\\sqrt{3}}{2} \\approx 0.866$.",
         "\\frac{\\sqrt{3}}{2}", 1.0),
    case("p", "It has $(2+1)(2+1) = 9$ divisors.", "9", 1.0),
    case("p", "The roots are $x = 1 \\pm \\sqrt{19}$.", "1 \\pm \\sqrt{19}", 1.0),
    case("p", "Thus the total is $400 + $60.", "460", 0.0),
    # forms of math-verify's own test suite (benchmarks/data/math_verify_cases.jsonl)
    case("p", "We have $x = 3$ here. So there are 12 sequences.", "12", 1.0),
    case("p", "Final Answer: The largest $n$ is 34.", "34", 1.0),
    case("p", "So $x \\approx 11$.", "11", 1.0),
    case("p", "Thus $x <= 2$ is our answer.", "x \\leq 2", 1.0),
    # a pair as a model writes it, and as math-verify's test writes it, each backslash doubled:
    # `\\` is a line break in LaTeX, no command
    case("p", "So it is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$", "(3, \\frac{\\pi}{2})", 1.0),
    case("p", "So it is $\\\\boxed{\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)}.$",
         "(3, \\frac{\\pi}{2})", 0.0),
    # verl's prime_math tests: a completion that is one piece of math, whole
    case("p", "\\frac{\\sqrt{505}}{7}", "\\frac{\\sqrt{505}}{7}", 1.0),
    case("p", "x^2 + y^2 + 4x - 6y + 13", "(x + 2)^2 + (y - 3)^2", 0.0),
    # a matrix laid out over lines is still one piece of math; lines outside it, a restated
    # sum or words are not
    case("p", "\\begin{bmatrix}\n -7 & 6 \\\\\n 11 & -9\n \\end{bmatrix}",
         "\\begin{pmatrix} -7 & 6 \\\\ 11 & -9 \\end{pmatrix}", 1.0),
    case("p", "\\begin{pmatrix}\n1 \\\\\n2\n\\end{pmatrix}",
         "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", 1.0),
    case("p", "\\begin{pmatrix}\n1 \\\\\n3\n\\end{pmatrix}",
         "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", 0.0),
    case("Compute $\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix} + \\begin{pmatrix} 3 \\\\ 4 \\end{pmatrix}$.",
         "\\begin{pmatrix}\n1 \\\\\n2\n\\end{pmatrix} + \\begin{pmatrix}\n3 \\\\\n4\n\\end{pmatrix}",
         "\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}", 0.0),
    case("p", "\\begin{pmatrix}\n1+3 \\\\\n2+4\n\\end{pmatrix}",
         "\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}", 0.0),
    case("p", "\\begin{pmatrix} 4 \\\\ 5 \\end{pmatrix}\n\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}",
         "\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}", 0.0),
    case("p", "\\begin{cases}\nx = 4 \\\\\ny = 6\n\\end{cases}", "6", 0.0),
    case("p", "\\begin{pmatrix}\n4 \\\\\n6\n\\end{pmatrix}\nor maybe the transpose",
         "\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}", 0.0),
    # a completion that is one worked sum states its result, as the same sum in a sentence does
    case("What is 2 + 8?", "2 + 8 = 10", "10", 1.0),
    case("What is 2 + 8?", "So 2 + 8 = 10.", "10", 1.0),
    case("p", "\\frac{1}{2} + 1 = \\frac{3}{2}", "\\frac{3}{2}", 1.0),
    case("p", "2 + 8 = 11", "10", 0.0),
    case("p", "Final Answer: The final answer is \\((-6, 10)\\). I hope it is correct.",
         "(-6, 10)", 1.0),
    case("p", "\\boxed{\\frac{1}{\\sqrt{3}}}", "\\frac{\\sqrt{3}}{3}", 0.0),
    case("p", "\\boxed{\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\end{pmatrix}}",
         "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", 1.0),
    case("p", "\\boxed{9\\pi \\text{ cm}^2}", "9\\pi", 1.0),
    # right answers in forms the rules above must not refuse
    case("p", "\\boxed{18\\ \\text{cm}^2}", "18", 1.0),
    case("p", "\\boxed{18\\ \\text{eggs}}", "18", 1.0),
    case("p", "The area is $18\\ \\text{cm}^2$.", "18", 1.0),
    case("p", "\\boxed{{18}}", "18", 1.0),
    case("p", "\\boxed{{\\frac{3}{4}}}", "\\frac34", 1.0),
    case("p", "\\boxed{18°C}", "18", 1.0),
    case("p", "The answer is 18 because each bag holds 6.", "18", 1.0),
    case("p", "The answer is 18 apples, since 3 bags hold 6 each.", "18", 1.0),
    case("p", "The answer is 18, as 3 x 6 = 18.", "18", 1.0),
    case("p", "The answer is 18 (eighteen).", "18", 1.0),
    case("p", "The answer is 18 (6 × 3).", "18", 1.0),
    case("p", "The answer is 18: 6 apples in each of 3 bags.", "18", 1.0),
    case("p", "The answer is 18; 3 bags hold 6 each.", "18", 1.0),
    case("What percent of the class passed?", "The answer is 18%.", "18", 1.0),
    case("p", "The roots are \\boxed{2} and \\boxed{3}.", "2, 3", 1.0),
    case("p", "First \\boxed{5}. Checking again, the total is \\boxed{18}.", "18", 1.0),
    case("p", "So \\boxed{18}\n\n\\boxed{18}", "18", 1.0),
    case("p", "He has 3 bags, so he has 18 apples.", "18", 1.0),
    case("p", "It is not 17; it is 18.", "18", 1.0),
    case(SIMPLIFY, "\\boxed{\\frac{2+\\sqrt{2}}{4}}", "\\frac{2+\\sqrt{2}}{4}", 1.0),
    case("p", "\\boxed{\\frac{3+\\sqrt{5}}{2}}", "\\frac{3+\\sqrt5}{2}", 1.0),
    case("p", "\\boxed{\\sqrt{3}+\\sqrt{2}}", "\\sqrt2+\\sqrt3", 1.0),
    case("p", "\\boxed{3 \\cdot 2^{n}}", "3\\cdot 2^n", 1.0),
    case("p", "\\boxed{2\\ln 2}", "\\ln 4", 1.0),
    case("p", "\\boxed{e^{2}}", "e^2", 1.0),
    case("p", "\\boxed{x^2-2x+1}", "x^2-2x+1", 1.0),
    case("p", "\\boxed{10 000}", "10000", 1.0),
    case("p", "The answer is 18 apples.", "18", 1.0),
    case("p", "The answer is 18 apples because 3 * 6 = 18.", "18", 1.0),
    case("p", "The answer is 18. Actually, it is 19.", "19", 1.0),
    case("p", "\\boxed{x = 2\\sqrt{3}}", "2\\sqrt{3}", 1.0),
    case("p", "\\boxed{y = 2x+3}", "y = 2x+3", 1.0),
    case("p", "\\boxed{x = 2 \\text{ or } x = 3}", "2, 3", 1.0),
    case("p", "**Answer:** $x = 3, 5, 7$", "3, 5, 7", 1.0),
    # the prompt's number that is the answer, where the prompt asks for no conversion
    case(
        "Shirt A is 25% off and shirt B is 30% off. Which discount, in percent, is larger?",
        "\\boxed{30\\%}", "30", 1.0,
    ),
    case(
        "Tom ate 3/4 of a pie and Ann ate 1/8. What fraction of the pie did Tom eat?",
        "\\boxed{\\frac{3}{4}}", "0.75", 1.0,
    ),
    # a list's numbers as plus-or-minus or as a set
    case("p", "\\boxed{\\pm 3}", "3, -3", 1.0),
    case("p", "\\boxed{\\pm 3}", "3", 0.0),
    case("p", "\\boxed{\\{2, 3\\}}", "2, 3", 1.0),
    case("p", "$x \\in \\{2, 3\\}$", "2, 3", 1.0),
    case("p", "\\boxed{\\{2, 4\\}}", "2, 3", 0.0),
    case("p", "\\boxed{\uff0d18}", "-18", 1.0),
    case("Express 2500 in scientific notation.", "\\boxed{2.5 \\times 10^3}", "2.5 \\times 10^3", 1.0),
    case("Express $\\frac{5}{2}$ as a mixed number.", "\\boxed{2\\frac{1}{2}}", "2\\frac{1}{2}", 1.0),
    case("Express 7 ÷ 8 as a decimal.", "\\boxed{0.875}", "0.875", 1.0),
    case("p", "\\boxed{\\sqrt 3+1}", "1+\\sqrt{3}", 1.0),
    case("p", "\\boxed{x^2+2x+1}", "(x+1)^2", 0.0),
    case("p", "\\boxed{2+3\\sqrt{2}}", "3\\sqrt{2}+2", 1.0),
    case("p", "\\boxed{3 \\cdot 2^{n}+1}", "3\\cdot 2^n+1", 1.0),
    case("p", "\\boxed{\\frac{1+\\sqrt{5}}{2}}", "\\frac{1+\\sqrt5}{2}", 1.0),
    case("p", "\\boxed{x^2-4x+4}", "x^2-4x+4", 1.0),
    case("p", "\\boxed{2x+1}", "1+2x", 1.0),
    case("p", "\\boxed{x_{1}+x_{2}}", "x_1+x_2", 1.0),
    case("What percent of 200 is 100?", "\\boxed{50\\%}", "50", 1.0),
    # an equation, a named tuple, a subscripted log, a spaced fraction: as the gold writes them
    case("p", "\\boxed{2x - y + 3z + 8 = 0}", "2x-y+3z+8=0", 1.0),
    case("p", "\\boxed{x^2 + y^2 = 25}", "x^2+y^2=25", 1.0),
    case("p", "\\boxed{\\frac{x^2}{4} + \\frac{y^2}{9} = 1}", "\\frac{x^2}{4}+\\frac{y^2}{9}=1", 1.0),
    case("p", "\\boxed{(a, b) = (2, 3)}", "(2,3)", 1.0),
    case("p", "\\boxed{(r, \\theta) = \\left(2, \\frac{\\pi}{3}\\right)}", "\\left(2, \\frac{\\pi}{3}\\right)", 1.0),
    case("p", "\\boxed{x = 1, x = -1}", "\\pm 1", 1.0),
    case("p", "\\boxed{\\log_2 3}", "\\log_2 3", 1.0),
    case("p", "\\boxed{\\log_2 3 + 1}", "1+\\log_2 3", 1.0),
    case("p", "\\boxed{\\frac 3 4}", "\\frac34", 1.0),
    # a percentage where the prompt mentions one but asks for a probability or a fraction
    case(
        "There is a 30% chance of rain tomorrow. What is the probability that it does not rain?",
        "\\boxed{70\\%}", "0.7", 1.0,
    ),
    case(
        "A store sells 40% of its apples on Monday and 50% of the rest on Tuesday. What fraction "
        "of the apples is left?", "The answer is 30%.", "0.3", 1.0,
    ),
    # the same quantity in another unit, and a next sentence that does not take it back
    case("p", "The answer is 2 hours, or 120 minutes.", "2", 1.0),
    case("p", "The answer is 18 dollars (or $18.00).", "18", 1.0),
    case("p", "The answer is 18 apples, or 1.5 dozen apples.", "18", 1.0),
    case("p", "The answer is 18. Actually, that is 9 eggs at $2 each.", "18", 1.0),
    case("p", "The answer is 18.\n\nNo. of eggs sold: 9", "18", 1.0),
    case("p", "The answer is 18. No eggs are wasted: 3 + 4 + 9 = 16.", "18", 1.0),
    case("p", "The answer is 18.\nNo, wait, it is 20.", "20", 1.0),
    # an answer set in an untagged fence, and a reasoning with nothing after it
    case("p", "The answer is:\n```\n18\n```", "18", 1.0),
    case("p", "```\n18\n```", "18", 1.0),
    case("p", "Answer:\n\n```text\n18\n```", "18", 1.0),
    case("p", "In markdown, write ``` to start code. She makes $18.\nThe answer is 18.", "18", 1.0),
    case("p", "<think>So the answer is \\boxed{18}.\n</think>", "18", 1.0),
    case("p", "\\boxed{(x-1)^2+(y-2)^2=9}", "(x-1)^2+(y-2)^2=9", 1.0),
    case(
        "A survey reports its results as a percentage. Of 200 people, 50 said yes. What "
        "fraction said yes?", "\\boxed{25\\%}", "0.25", 1.0,
    ),
    case("p", "The answer is 45 minutes, or 3/4 of an hour.", "45", 1.0),
    case("p", "The answer is 18 dollars, or 1800 cents.", "18", 1.0),
    case("p", "The answer is 18. Actually, she makes 18 dollars a day.", "18", 1.0),
    case("p", "The answer is 18 dollars per day, or 126 dollars per week.", "18", 1.0),
    case("p", "The answer is 2 km or 2000 m.", "2", 1.0),
    case("p", "The answer is 36 eggs, or 3 dozen.", "36", 1.0),
    case("p", "The answer is 2.5 hours, or 2 hours and 30 minutes.", "2.5", 1.0),
    case("p", "The answer is 8 quarters, or 2 dollars.", "8", 1.0),
    case("p", "The answer is 150 minutes, or 2 hours 30 minutes.", "150", 1.0),
    case("p", "<think>x = 3</think>", "3", 1.0),
    case("p", "The answer is 18 dollars. Wait, that's per day; per week it is 126.", "18", 1.0),
    case("p", "The answer is 18 dollars. Or, written out: 9 x $2.", "18", 1.0),
    case("p", "The answer is 18. Or $18.00 in total.", "18", 1.0),
    case("p", "Here is the answer:\n```\nx = 18\n```", "18", 1.0),
    case("p", "Final answer:\n```text\nTotal = $18\n```", "18", 1.0),
    case("p", "<think>She makes 18.</think>", "18", 1.0),
    case("p", "<think>Therefore she makes $18 per day.</think>", "18", 1.0),
    case(
        "Of 200 shirts, 50 sold. Determine the percentage of shirts sold.",
        "The answer is 25%.", "25", 1.0,
    ),
    case("p", "\\boxed{1.8 \\times 10^{1}}", "18", 1.0),
    case("p", "\\boxed{0.\\overline{3}}", "\\frac{1}{3}", 1.0),
    # bold, a word in `\text{}`, a dash for a minus, an exponent's base, a mixed number
    *(case("p", W + ending, "18", 1.0) for ending in (
        "The answer is **18**.", "**Answer: 18**", "The final answer is **18**")),
    case("p", "The answer is 71. The answer is 72.", "72", 1.0),
    case("p", "\\boxed{\\text{B}}", "B", 1.0),
    case("p", "\\boxed{\\text{B}}", "(B)", 1.0),
    case("p", "\\boxed{\\text{Yes}}", "Yes", 1.0),
    case("p", "\\boxed{\\mathrm{East}}", "East", 1.0),
    case("p", "\\boxed{\u20134}", "-4", 1.0),
    case("p", "The answer is \u20134.", "-4", 1.0),
    case("p", "The answer is - 4.", "-4", 1.0),
    case("p", "The garden is 8 m by 6 m, so its area is 48 m^2.", "48", 1.0),
    case("p", "It takes 1 1/2 hours.", "1.5", 1.0),
    case("p", "\\boxed{1 1/2}", "1.5", 1.0),
    case("p", "The answer is 18 (6 \u00d7 3), since 3 bags hold 6 each.", "18", 1.0),
    case("p", "The answer is 72. Sorry for the long working.", "72", 1.0),
    case("p", "So she has 3 apples and 4 pears, so 7 fruits.", "7", 1.0),
    case("p", "\\boxed{4 \\text{ m}}", "4", 1.0),
    case("p", "The price rose to 4 dollars.", "4", 1.0),
    # markdown emphasis around the last number is no multiplication
    *(case("p", W + ending, "18", 1.0) for ending in (
        "So, Janet makes **$18** every day.", "**18**", "## Answer\n**18**",
        "She makes *18* dollars.", "**Final answer:** **18**", "In total: **18**")),
    case("p", W + "Total cost: **$1,250**", "1250", 1.0),
    case("p", "<think>9 \u00d7 2 = 18</think>\n\nJanet makes **$18** per day.", "18", 1.0),
    # a change from one number to another ends on the second: no range
    *(case("p", W + ending, "18", 1.0) for ending in (
        "So the amount goes from 12 to 18.", "The count increases by 2 to 18.",
        "So the count goes up by 3 to 18.", "The total rises from 9 to 18.")),
    case("p", "The population grew from 1,200 to 1,500.", "1500", 1.0),
    # a dash after a word that is no relation separates, it is no minus
    *(case("p", W + ending, "18", 1.0) for ending in (
        "Final answer - 18", "Final answer \u2013 18", "Final answer \u2014 18",
        "Total \u2013 18 dollars", "Result - 18", "Result: - 18")),
    # a later number in the sentence after a word that is no hedge: a reason or a condition
    *(case("p", W + f"The answer is 18{rest}", "18", 1.0) for rest in (
        ", up 2 from yesterday.", " dollars, and she sold 9 eggs.",
        " dollars, not counting the 7 eggs she uses.", ", but note that she keeps 7 eggs.",
        " dollars total, compared to 16 yesterday.", " dollars, to cover 2 meals.",
        " dollars if she sells all 9 eggs.", " today and 20 tomorrow.", ", then 2 more tomorrow.",
        ", against 16 last week.", ", or about 18.0.", ", within the 10-20 range.",
        ", between 17 and 19.", " dollars daily, 126 weekly.")),
    case("p", "The answer is 2 hours, equivalent to 120 minutes.", "2", 1.0),
    case("p", "The answer is 540 meters, about half a kilometer, or 0.54 km.", "540", 1.0),
    # an approximation or an equal value after stated math
    case("p", "The final answer is $\\frac{\\sqrt{3}}{2}$, approximately 0.866.",
         "\\frac{\\sqrt{3}}{2}", 1.0),
    case("p", "The answer is $9\\pi$ square units, or roughly 28.27 square units.", "9\\pi", 1.0),
    case("p", "The final answer is $5\\sqrt{2}$ units, about 7.07 units.", "5\\sqrt{2}", 1.0),
    case("p", "The final answer is $\\frac{1}{2}$ (or 50%).", "\\frac{1}{2}", 1.0),
    case("p", "The answer is $\\frac{3}{4}$ = 0.75.", "\\frac{3}{4}", 1.0),
    # a difference a question asks for ("how many more"), and a time of day
    case("How many more apples does Tom have?", "Tom has 12 - 7 = 5 more apples. The answer is 5 "
         "more apples.", "5", 1.0),
    case("p", "The answer is 3 fewer cookies.", "3", 1.0),
    case("p", "The answer is 3 less.", "3", 1.0),
    case("p", "He arrives at 3 p.m. The answer is 3 p.m.", "3", 1.0),
    case("p", "The answer is 3 PM.", "3", 1.0),
    # forms the rules above must not refuse: an interval after "x in", named values for a pair,
    # a reason restating the value in another form, a percentage near it, an equal value "also
    # acceptable", another unit on the next line
    case("p", "\\boxed{x \\in [2, \\infty)}", "[2, \\infty)", 1.0),
    case("p", "\\boxed{x \\in (-2, 2)}", "(-2, 2)", 1.0),
    case("p", "\\boxed{x=1, y=3}", "(1, 3)", 1.0),
    *(case("p", f"The answer is 18{rest}", "18", 1.0) for rest in (
        " because she has 9 eggs left, or 9 \u00d7 2 dollars.", " since 9 \u00d7 2 = 18, or 36/2.",
        " since 180/60 = 3 times 6, or 18.0.", ", about 83% of her hourly rate.",
        "; 18.0 is also acceptable.", "; 1800 cents is also correct.",
        " dollars\nor 1800 cents.")),
    case("p", "The answer is $\\frac{3}{8}$ since 3 of the 8 outcomes work, or 0.375.",
         "\\frac{3}{8}", 1.0),
    case("p", "**Answer: 3** since white is half of 2, or 1 bolt.", "3", 1.0),
    # an approximate word before the last number, another quantity near a stated one
    case("p", "The answer is 18 dollars, or about 20 euros.", "18", 1.0),
    case("p", "The answer is 18 dollars (18.00).", "18", 1.0),
    case("p", "The trip takes about 3 hours.", "3", 1.0),
    case("p", "So she makes 18 dollars. That is approximately 18.", "18", 1.0),
    case("p", "The answer is 18, around 2 dozen eggs' worth.", "18", 1.0),
    case("p", "The answer is 3/8, or about 3/8.0.", "\\frac{3}{8}", 1.0),
    # two boxes that are two parts of one answer, a box repeated, a box after a finished sentence
    case("p", "\\[\\boxed{2}\\] and \\[\\boxed{3}\\]", "2, 3", 1.0),
    case("p", "\\boxed{72} or \\boxed{72}", "72", 1.0),
    case("p", "First I got \\boxed{71}. Checking it, \\boxed{72}.", "72", 1.0),
    # later words that are no second answer
    case("p", "The answer is 18; 2 eggs are also left over.", "18", 1.0),
    case("p", "The answer is 18 as well.", "18", 1.0),
    # a named value, a bar over a repeating digit, the empty set's other symbol, a worked sum
    case("p", "\\boxed{\\text{Total} = 18}", "18", 1.0),
    case("p", "\\boxed{f(2) = 4}", "4", 1.0),
    case("p", "$k = \\frac{1}{3}$", "1/3", 1.0),
    # a model that runs on into the chat template's next turn: its answer is before it
    case("p", "The pair that solves it is $(7, 6)$. <|im_start|>user", "(7, 6)", 1.0),
    case("p", "The answer is 18.<|im_end|>\n<|im_start|>user\nAnd 19?<|im_end|>", "18", 1.0),
    case("p", "The answer is 18.<|im_end|>\n<|im_start|>user\nAnd 19?<|im_end|>", "19", 0.0),
    case("p", "<|im_start|>assistant\nThe answer is 18.<|im_end|>", "18", 1.0),
    case("p", "The answer is <s>17</s> 18.", "18", 1.0),
    case("p", "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is 18.<|eot_id|>",
         "18", 1.0),
    # another role's turn is no answer of the model's; a marker in a thought or a program is
    # no end of its turn
    case("p", "<|im_start|>user\nThe answer is 18<|im_end|><|im_start|>assistant\nIt is 19",
         "18", 0.0),
    case("p", "<|im_start|>system\nThe answer is 18<|im_end|>\n<|im_start|>assistant\nNo idea",
         "18", 0.0),
    case("p", "<|user|>The answer is 8<|assistant|>The answer is 9", "8", 0.0),
    case("p", "<think>The answer is 18 <|im_end|> no</think>The answer is 19", "18", 0.0),
    case("p", "<think>hmm <|endoftext|></think>\\boxed{5}", "5", 1.0),
    case("p", "```python\nprint('<|im_end|>')\n```\nThe answer is 5", "5", 1.0),
    # a step's result boxed, then the final answer stated in Minerva's form
    case("p", "Interest: $\\boxed{255}$, so $10,455 in all. The final answer is $10,455$.",
         "10455", 1.0),
    case("p", "Interest: $\\boxed{255}$, so $10,455 in all. The final answer is $10,455$.",
         "255", 0.0),
    case("p", "\\boxed{5}. The final answer is $\\boxed{5}$.", "5", 1.0),
    # a pair or an interval: each part paid as an answer of its own, in order
    case("p", "\\boxed{(1, 4.5)}", "(1,\\frac{9}{2})", 1.0),
    case("p", "\\boxed{[0.5, 2)}", "[\\frac{1}{2}, 2)", 1.0),
    case("p", "\\boxed{x \\in (1, 4.5)}", "(1, \\frac{9}{2})", 1.0),
    case("p", "\\boxed{(0.5, 2)}", "[\\frac{1}{2}, 2)", 0.0),
    case("p", "\\boxed{(0.33, 1)}", "(\\frac{1}{3}, 1)", 0.0),
    case("p", "\\boxed{(2, 1)}", "(1, 2)", 0.0),
    case("p", "\\boxed{(1, 3+1)}", "(1, 4)", 0.0),
    case("p", "\\boxed{(\\frac{2}{4}, 1)}", "(\\frac{1}{2}, 1)", 0.0),
    case("p", "\\boxed{[0, +\\infty)}", "[0, \\infty)", 1.0),
    # a reference with its number in inline math and its unit after it
    case("p", "The distance is \\boxed{125 \\text{ miles}}.", "$125$ miles", 1.0),
    case("p", "The answer is 125.", "$125$ miles", 1.0),
    case("p", "The answer is 126.", "$125$ miles", 0.0),
    case("p", "\\boxed{[1, +\\infty)}", "[0, \\infty)", 0.0),
    case("p", "The answer is $k = 12$.", "12", 1.0),
    case("p", "\\boxed{0.\\bar{1}}", "\\frac{1}{9}", 1.0),
    case("p", "\\boxed{\\varnothing}", "\\emptyset", 1.0),
    case("p", "The answer is 48 + 24 = 72.", "72", 1.0),
    case("p", "\\boxed{(3, 4)}", "(3, 4)", 1.0),
    case("p", "\\boxed{[3, 4]}", "[3, 4]", 1.0),
    case("p", "\\boxed{2^{-60}}", "2^{-60}", 1.0),
    # infinities, equal however signed: their difference is no number to compare
    case("p", "\\boxed{+\\infty}", "\\infty", 1.0),
    case("p", "\\boxed{\\infty}", "+\\infty", 1.0),
    case("p", "\\boxed{(-\\infty, +\\infty)}", "(-\\infty, \\infty)", 1.0),
    case("p", "\\boxed{-\\infty}", "+\\infty", 0.0),
    # the answer a statement after the last box gives
    case("p", "\\boxed{46}. The answer is 47.", "47", 1.0),
    case("p", "\\boxed{46}\n\nThe answer is 46 apples.", "46", 1.0),
    case("p", "\\boxed{\\frac{1}{2}}\n\nThe answer is 0.5.", "\\frac{1}{2}", 1.0),
    case("p", "#### 47\n\\boxed{46}", "46", 1.0),
    case("p", "The answer is 47. \\boxed{46}", "46", 1.0),
    case("p", "<answer>46</answer> then \\boxed{47}", "47", 1.0),
    case("p", "\\boxed{47} then <answer>46</answer>", "46", 1.0),
    case("p", "<answer>18</answer>\nI hope this answer is correct.", "18", 1.0),
    case("p", "\\boxed{B}. The answer is C.", "C", 1.0),
    case("p", "\\boxed{B}. I am sure this answer is correct.", "B", 1.0),
    # a number whose thousands are set apart by `,\\!` and a space: one number, no list
    case("p", "is $\\boxed{11,\\! 111,\\! 111,\\! 100}$", "11111111100", 1.0),
    # members the reference repeats too, a pair's equal parts, a set in another order
    case("p", "\\boxed{1, 1}", "1, 1", 1.0),
    case("p", "\\boxed{(1, 1)}", "(1, 1)", 1.0),
    case("p", "\\boxed{(\\sqrt{2}, \\sqrt{2})}", "(\\sqrt{2}, \\sqrt{2})", 1.0),
    case("p", "\\boxed{\\{\\sqrt{2}, 1\\}}", "\\{1, \\sqrt{2}\\}", 1.0),
    # a sign or a bar the reference holds too
    case("p", "\\boxed{\\pm\\sqrt{2}}", "\\pm\\sqrt{2}", 1.0),
    case("p", "\\boxed{\\frac{1 \\pm \\sqrt{5}}{2}}", "\\frac{1 \\pm \\sqrt{5}}{2}", 1.0),
    case("p", "\\boxed{|x|+1}", "|x|+1", 1.0),
    # a one or a zero that is the answer's own
    case("p", "\\boxed{x^{10}+1}", "x^{10}+1", 1.0),
    case("p", "\\boxed{e^{1/x}}", "e^{\\frac{1}{x}}", 1.0),
    case("p", "\\boxed{\\frac{1}{\\sqrt{2}}x}", "\\frac{x}{\\sqrt{2}}", 1.0),
    case("p", "\\boxed{(-1, 1)}", "(-1,1)", 1.0),
    case("p", "\\boxed{x_1 - x_0}", "x_1-x_0", 1.0),
    case("p", "\\boxed{\\begin{pmatrix}1\\\\2\\sqrt{3}\\end{pmatrix}}",
         "\\begin{pmatrix}1\\\\2\\sqrt{3}\\end{pmatrix}", 1.0),
    # thousands grouped by LaTeX spaces
    case("p", "\\boxed{1\\,234\\,567}", "1234567", 1.0),
    case("p", "\\boxed{10\\ 000}", "10000", 1.0),
    case("p", "\\boxed{3\\,\\frac{1}{2}}", "3.5", 1.0),
]
# fmt: on


@pytest.mark.parametrize(
    ("prompt", "completion", "gold", "expected"), UNDONE + MALFORMED_GOLDS + STATED
)
def test_strict_correct_pays_a_stated_simplified_answer(prompt, completion, gold, expected):
    symbolic = gold is not None and any(c.isalpha() for c in gold) and expected == 1.0
    if symbolic and not has_math_verify():
        pytest.skip("math-verify (extra `math`) not installed")
    assert answer_match_reward([prompt], [completion], answer=[gold]) == [expected]


def test_evaluation_counts_malformed_references_apart(monkeypatch):
    texts = ["\\boxed{18}", "\\boxed{None}", "\\boxed{3}", "\\boxed{nan}"]
    monkeypatch.setattr(
        "oncurve.loop.evaluate.draw",
        lambda *args: (
            SimpleNamespace(
                texts=texts,
                completion_token_lists=lambda: [[1]] * 4,
                completion_lengths=torch.ones(4, dtype=torch.long),
            ),
            {},
        ),
    )
    rows = [
        {"prompt": "p", "prompt_ids": [1], "answer": answer}
        for answer in ("18", "None", "4", float("nan"))
    ]
    records: list[dict] = []
    result = evaluate(None, rows, answer_match_reward, SamplingParams(4), records=records)
    assert result == {"accuracy": 0.5, "unscored": 2.0}
    assert [r["greedy_correct"] for r in records] == [1.0, None, 0.0, None]


@pytest.mark.skipif(not has_math_verify(), reason="math-verify (extra `math`) not installed")
def test_python_tool_scores_as_the_correct_reward_does():
    prompt = "Compute $\\sin^2 x + \\cos^2 x + x$."
    turn = "\\boxed{\\sin^2 x + \\cos^2 x + x}"  # the question restated
    assert answer_match_reward([prompt], [turn], answer=["1+x"]) == [0.0]
    env = PythonToolEnv(timeout_s=2.0, memory_mb=256)
    env.reset({"prompt": prompt, "answer": "1+x"})
    assert env.step(turn) == (None, 0.0, True)
    env.reset({"prompt": prompt, "answer": "1+x"})
    assert env.step("\\boxed{x+1}") == (None, 1.0, True)
    for missing in ({}, {"answer": None}, {"answer": "None"}, {"answer": ""}):
        env.reset({"prompt": prompt, **missing})
        observation, score, done = env.step("\\boxed{None}")
        assert observation is None and math.isnan(score) and done


# Comparisons that would build a huge number in C, whatever letters dress it, on either side:
# refused before math-verify sees them (the gold's too), so they cost nothing.
UNBOUNDED = [
    ("\\boxed{(x-x+9999999)!}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{\\Gamma(10^{8})}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{\\prod_{i=1}^{10^8} i}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{\\sum_{i=1}^{10^9} i^{i}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{2^{x^{x^{9}}}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{2^{999 \\cdot 999 \\cdot 999}}", "\\sqrt{2}"),
    ("\\boxed{2^{999 \\times 999}}", "\\sqrt{2}"),
    ("\\boxed{\\exp(\\exp(\\exp(99)))}", "\\sqrt{2}"),
    ("\\boxed{e^{e^{99}}}", "\\sqrt{2}"),
    ("\\boxed{x}", "(x-x+9999999)!"),
    ("\\boxed{x}", "\\Gamma(10^{8})"),
]


@pytest.mark.parametrize(("completion", "gold"), UNBOUNDED)
def test_unbounded_values_never_reach_math_verify(monkeypatch, completion, gold):
    compared: list[tuple[str, str]] = []
    monkeypatch.setattr(
        "oncurve.rewards.math.symbolic_equal", lambda *pair: compared.append(pair) or True
    )
    assert answer_match_reward(["p"], [completion], answer=[gold]) == [0.0]
    assert compared == []


@pytest.mark.parametrize("radicand", ["99999999999973", "99999999999999999989"])
def test_a_large_radicand_is_refused_without_factoring_it(radicand):
    # trial division of a 20-digit prime takes the caller's thread an hour: a hang, not a speed
    scores = []
    thread = threading.Thread(
        target=lambda: scores.extend(
            answer_match_reward(["p"], [f"\\boxed{{\\sqrt{{{radicand}}}}}"], answer=["2\\sqrt{3}"])
        ),
        daemon=True,
    )
    thread.start()
    thread.join(60)
    assert scores == [0.0]
