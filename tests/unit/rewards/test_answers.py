import subprocess
import sys
from collections.abc import Callable

import pytest

from oncurve.rewards import answers_match, extract_answer, resolve_reward
from oncurve.rewards.format import (
    boxed_format_reward,
    length_penalty,
    overlong_penalty,
    tags_format_reward,
    think_answer_format_reward,
)
from oncurve.rewards.math import has_math_verify

EXTRACT_CASES = [
    # (text, style, expected)
    ("<answer>42</answer>", "auto", "42"),
    ("<think>maybe 3</think><answer> 7 </answer>", "auto", "7"),
    ("<answer>1</answer> then <answer>2</answer>", "tags", "2"),
    ("<ANSWER>5</ANSWER>", "tags", "5"),
    ("<answer>unterminated 5", "tags", None),
    ("<answer>\\boxed{12}</answer>", "auto", "12"),
    ("so the answer is \\boxed{\\frac{1}{2}}.", "auto", "\\frac{1}{2}"),
    ("\\boxed{\\boxed{5}}", "boxed", "5"),
    ("\\boxed{x^{2}+\\frac{1}{\\sqrt{2}}}", "boxed", "x^{2}+\\frac{1}{\\sqrt{2}}"),
    ("first \\boxed{1}, finally \\boxed{2}", "boxed", "2"),
    ("\\boxed{a + \\boxed{b}}", "boxed", "a + \\boxed{b}"),
    ("\\boxed {3}", "boxed", "3"),
    ("the answer is \\boxed 7.", "boxed", "7"),
    ("\\fbox{9}", "boxed", "9"),
    ("\\boxed{unbalanced", "boxed", None),
    ("no box here 5", "boxed", None),
    ("Natalia sold 48+24 = 72 clips.\n#### 72", "gsm8k", "72"),
    ("#### 1,000\nextra", "gsm8k", "1,000"),
    ("#### -5", "auto", "-5"),
    ("####   \n", "gsm8k", None),
    ("The total is 1,234,567 dollars.", "last_number", "1,234,567"),
    ("values 1,2,3", "last_number", "3"),
    ("It is -3.5.", "last_number", "-3.5"),
    ("x is 3/4 of y", "last_number", "3/4"),
    ("first 10 then 20", "auto", "20"),
    ("a .5 chance", "last_number", ".5"),
    ("version v2 and x3", "last_number", None),
    ("no digits at all", "auto", None),
    # the answer is what follows the reasoning, outside code
    ("<think>The answer is 18.</think>\nI could not solve it.", "auto", None),
    ("<think>so 3</think> The answer is 4.", "auto", "4"),
    ("```python\nprint(18)\n```\nI could not solve it.", "auto", None),
    ("```python\nprint('#### 19')\n```\nThe answer is 18.", "auto", "18"),
    ("3 + 4 = 7\n```python\nx = 3\n```", "auto", "7"),
    ("", "auto", None),
    # emphasis is no operator, a change no range, a dash after a word no minus
    ("So she makes **18** dollars.", "last_number", "18"),
    ("She makes *18* dollars.", "last_number", "18"),
    ("The count grew from 12 to 18.", "last_number", "18"),
    ("The count increases by 2 to 18.", "last_number", "18"),
    ("So she has 3 to 4 apples.", "last_number", None),
    ("Final answer - 18", "last_number", "18"),
    ("The answer is - 4.", "last_number", "-4"),
    ("It is 18, or maybe 3\u00b2.", "last_number", None),
    ("The number of subsets is 32, since 2^5.", "last_number", "32"),
    # a stated number's later words: a reason keeps it, a hedge reads the sentence whole
    ("The answer is 18, up 2 from yesterday.", "auto", "18"),
    ("The answer is 3 p.m.", "auto", "3"),
    ("The answer is 5 more apples.", "auto", "5"),
    ("The answer is 3, but actually 4.", "auto", "3, but actually 4."),
    ("The answer is $\\frac{3}{4}$ = 0.75.", "auto", "\\frac{3}{4}"),
    ("The answer is $\\frac{1}{2}$ (or 50%).", "auto", "\\frac{1}{2}"),
    ("#### 18 (or 19)", "gsm8k", "18 (or 19)"),
]


@pytest.mark.parametrize(("text", "style", "expected"), EXTRACT_CASES)
def test_extract_answer(text: str, style: str, expected: str | None) -> None:
    assert extract_answer(text, style) == expected


@pytest.mark.parametrize("style", ["auto", "last_number"])
def test_extraction_of_a_long_run_of_thousands_groups_is_linear(style: str) -> None:
    """`1,111,...,1111`: a run of comma groups whose last group is no thousands group is read
    once, not once per comma (200 KB took minutes, holding the GIL); in a process of its own,
    killed after a deadline far above the milliseconds it takes."""
    code = (
        "from oncurve.rewards import extract_answer\n"
        f"text = 'So the list is 1' + ',111' * 50_000 + '1'\n"
        f"print(extract_answer(text, {style!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True
    )
    assert done.stdout.strip() == "1111"


def test_extract_answer_rejects_unknown_style() -> None:
    with pytest.raises(ValueError, match="style must be one of"):
        extract_answer("1", "xml")


MATCH_CASES = [
    # (predicted, gold, expected)
    ("42", "42", True),
    ("1,000", "1000", True),
    ("1000.0", "1000", True),
    ("1000.00", "1,000", True),
    ("1,000", "100", False),
    ("3/4", "\\frac{3}{4}", True),
    ("0.75", "\\dfrac{3}{4}", True),
    ("\\tfrac34", "0.75", True),
    ("-\\frac{3}{4}", "-0.75", True),
    ("\\frac{-3}{4}", "-3/4", True),
    ("-5", "5", False),
    ("-5", "-5.0", True),
    ("5.", "5", True),
    ("$5$", "5", True),
    ("\\$18", "18", True),
    (" 18 ", "18", True),
    ("x = 5", "5", True),
    ("50\\%", "50", True),
    ("90^\\circ", "90", True),
    ("\\text{(B)}", "(B)", True),
    ("b", "B", True),
    ("\\boxed{7}", "7", True),
    ("0.333", "1/3", False),
    ("1e3", "1000", True),
    ("2", "3", False),
    (None, "3", False),
    ("", "0", False),
    ("1/0", "1", False),
]


@pytest.mark.parametrize(("predicted", "gold", "expected"), MATCH_CASES)
def test_answers_match(predicted: str | None, gold: str, expected: bool) -> None:
    assert answers_match(predicted, gold) is expected


SYMBOLIC_CASES = [
    # (predicted, gold, strict, expected)
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True, True),
    # strict pays the form the reference states: expanded for expanded, factored for factored
    ("(x+1)^2", "x^2+2x+1", True, False),
    ("(x+1)^2", "x^2+2x+1", False, True),
    ("\\pi", "3.14", True, False),
    ("2\\sqrt{3}", "\\sqrt{12}", True, True),
    ("x^2 + 2xy + y^2", "(x+y)^2", True, False),
    ("x^2 + 2xy + y^2", "(x+y)^2", False, True),
    ("(y+x)^2", "(x+y)^2", True, True),
    ("1024", "2^{10}", True, True),
    # a numeric reference takes a stated number only, unless the match is lenient
    ("2^{10}", "1,024", True, False),
    ("2^{10}", "1,024", False, True),
]


@pytest.mark.skipif(not has_math_verify(), reason="math-verify (extra `math`) not installed")
@pytest.mark.parametrize(("predicted", "gold", "strict", "expected"), SYMBOLIC_CASES)
def test_answers_match_symbolic(predicted: str, gold: str, strict: bool, expected: bool) -> None:
    assert answers_match(predicted, gold, strict=strict) is expected


def test_prose_is_not_sent_to_math_verify(monkeypatch) -> None:
    import oncurve.rewards.math

    def fail(*args):
        raise AssertionError("symbolic_equal called")

    monkeypatch.setattr(oncurve.rewards.math, "symbolic_equal", fail)
    assert answers_match("the answer is forty two", "42") is False
    assert answers_match("x" * 101, "x") is False
    # a numeric reference never needs it
    assert answers_match("\\sqrt{4}", "2") is False
    with pytest.raises(AssertionError, match="symbolic_equal called"):
        answers_match("\\sqrt{4}", "2", strict=False)


def test_correct_reward_scores_and_skips_missing_gold() -> None:
    name, fn = resolve_reward("correct")
    completions = ["<answer>1,000</answer>", "#### 7", "I think 3", "nothing"]
    scores = fn(["p"] * 4, completions, answer=["1000", "8", "", "1"])
    assert name == "correct"
    assert scores == [1.0, 0.0, None, 0.0]


def test_correct_reward_needs_answer_column() -> None:
    with pytest.raises(ValueError, match="'answer' column"):
        resolve_reward("correct")[1](["p"], ["1"], numbers=["1"])


def test_format_rewards() -> None:
    good = "<think>\nwork\n</think>\n<answer>4</answer>\n"
    completions = [good, "<answer>4</answer>", "<think>w</think><answer>4</answer> extra", "x"]
    assert think_answer_format_reward(["p"] * 4, completions) == [1.0, 0.0, 0.0, 0.0]
    assert tags_format_reward(["p"] * 4, completions) == [1.0, 1.0, 1.0, 0.0]
    # the R1-Zero template opens <think> in the prompt
    opened = think_answer_format_reward(["Assistant: <think>"], ["w</think><answer>4</answer>"])
    assert opened == [1.0]


Reward = Callable[..., list[float]]

# (reward, a completion with structure and no content, the same structure with an answer in it)
CONTENT_FREE_CASES = [
    *(
        pytest.param(boxed_format_reward, f"\\boxed{{{empty}}}", f"\\boxed{{{empty} 1}}", id=label)
        for label, empty in (
            ("boxed-cdots", "\\cdots"),
            ("boxed-vdots", "\\vdots"),
            ("boxed-unicode-ellipsis", "\u22ef"),
            ("boxed-null", "\\null"),
            ("boxed-nonumber", "\\nonumber"),
            ("boxed-underset-of-nothing", "\\underset{}{}"),
            ("boxed-stackrel-of-nothing", "\\stackrel{}{}"),
            ("boxed-unicode-minus", "\u2212"),
            ("boxed-latex-comment", "% 7\n"),
            ("boxed-iffalse", "\\iffalse 7\\fi"),
            ("boxed-ignorespaces", "\\ignorespaces"),
            ("boxed-protect", "\\protect"),
            ("boxed-unskip", "\\unskip"),
            ("boxed-xspace", "\\xspace"),
            ("boxed-footnote", "\\footnote{7}"),
            ("boxed-textcolor-white", "\\textcolor{white}{7}"),
            ("boxed-scalebox-zero", "\\scalebox{0}{7}"),
            # commands that are no symbol show nothing, whatever they do to the page
            ("boxed-newpage", "\\newpage"),
            ("boxed-centering", "\\centering"),
            ("boxed-pagebreak", "\\pagebreak"),
            ("boxed-clearpage", "\\clearpage"),
            ("boxed-vbox", "\\vbox{}"),
            ("boxed-fi", "\\fi"),
            ("boxed-hfilneg", "\\hfilneg"),
            ("boxed-unknown-command", "\\foo"),
            ("boxed-langle", "\\langle\\rangle"),
            ("boxed-section-sign", "\\S"),
            ("boxed-degree", "\\degree"),
            ("boxed-currency", "\\textdollar"),
            ("boxed-pounds", "\\pounds"),
            ("boxed-backslash", "\\backslash"),
            ("boxed-ampersand", "\\And"),
            # ... nor the arguments of an index entry, a definition or a setting
            ("boxed-index", "\\index{4}"),
            ("boxed-newcommand", "\\newcommand{\\x}{4}"),
            ("boxed-renewcommand", "\\renewcommand{\\x}[1]{4}"),
            ("boxed-def", "\\def\\x{4}"),
            ("boxed-setcounter", "\\setcounter{page}{4}"),
            ("boxed-setlength", "\\setlength{\\parindent}{4pt}"),
            ("boxed-pagestyle", "\\pagestyle{empty}"),
        )
    ),
    # white or transparent text in any colour model; the same text in another colour shows
    *(
        pytest.param(boxed_format_reward, f"\\boxed{{{white}}}", f"\\boxed{{{shown}}}", id=label)
        for label, white, shown in (
            ("boxed-rgb-white", "\\textcolor[rgb]{1,1,1}{4}", "\\textcolor[rgb]{1,0,0}{4}"),
            (
                "boxed-rgb-white-decimals",
                "\\textcolor[rgb]{1.0, 1, 1.00}{4}",
                "\\textcolor[rgb]{0.9,1,1}{4}",
            ),
            ("boxed-RGB-white", "\\textcolor[RGB]{255,255,255}{4}", "\\textcolor[RGB]{1,1,1}{4}"),
            ("boxed-HTML-white", "\\textcolor[HTML]{FFFFFF}{4}", "\\textcolor[HTML]{FF0000}{4}"),
            ("boxed-html-white", "\\textcolor[HTML]{ffffff}{4}", "\\textcolor[HTML]{000000}{4}"),
            ("boxed-gray-white", "\\color[gray]{1}4", "\\color[gray]{0.5}4"),
            ("boxed-cmyk-white", "\\textcolor[cmyk]{0,0,0,0}{4}", "\\textcolor[cmyk]{0,0,0,1}{4}"),
            ("boxed-transparent", "\\color{transparent}4", "\\color{black}4"),
            ("boxed-css-white", "\\textcolor{#FFF}{4}", "\\textcolor{#F00}{4}"),
            ("boxed-css-white-long", "\\color{#ffffff}4", "\\color{#fffff0}4"),
            (
                "boxed-white-option-spaced",
                "\\textcolor [ rgb ] {1,1,1}{4}",
                "\\textcolor [ rgb ] {1,1,0}{4}",
            ),
            ("boxed-rgb-beyond-white", "\\textcolor[rgb]{2,1,1}{4}", "\\textcolor[rgb]{2,1,0}{4}"),
            ("boxed-HSB-white", "\\textcolor[HSB]{0,0,240}{4}", "\\textcolor[HSB]{0,240,240}{4}"),
            ("boxed-HSB-hue", "\\textcolor[HSB]{80,0,240}{4}", "\\textcolor[HSB]{80,0,239}{4}"),
            ("boxed-hsb-white", "\\textcolor[hsb]{0.5,0,1}{4}", "\\textcolor[hsb]{0.5,1,1}{4}"),
            ("boxed-Hsb-white", "\\textcolor[Hsb]{120,0,1}{4}", "\\textcolor[Hsb]{120,1,1}{4}"),
            ("boxed-Gray-white", "\\color[Gray]{15}4", "\\color[Gray]{14}4"),
            # KaTeX's hexadecimal colours: six digits without `#`, an alpha of 00 is transparent
            ("boxed-katex-bare-hex", "\\textcolor{FFFFFF}{4}", "\\textcolor{FFFFF0}{4}"),
            ("boxed-hex-alpha-white", "\\textcolor{#FFFF}{4}", "\\textcolor{#F00F}{4}"),
            ("boxed-hex-transparent", "\\color{#00000000}4", "\\color{#000000FF}4"),
            # xcolor's mixes: `c!p` is p% of c and the rest white, `c!p!d` p% of c and the
            # rest d, left to right; a leading `-` takes the complement
            ("boxed-mix-none-of-red", "\\textcolor{red!0}{4}", "\\textcolor{red!50}{4}"),
            ("boxed-mix-all-white", "\\color{white!100}4", "\\color{white!99!black}4"),
            ("boxed-mix-none-of-black", "\\textcolor{black!0}{4}", "\\textcolor{black!1}{4}"),
            (
                "boxed-mix-into-white",
                "\\textcolor{red!0!white}{4}",
                "\\textcolor{red!0!black}{4}",
            ),
            (
                "boxed-mix-chain",
                "\\textcolor{red!50!blue!0}{4}",
                "\\textcolor{red!50!blue!1}{4}",
            ),
            (
                "boxed-mix-chain-into-white",
                "\\textcolor{red!30!black!0!white}{4}",
                "\\textcolor{red!30!white!0!black}{4}",
            ),
            ("boxed-mix-beyond-range", "\\textcolor{red!-5}{4}", "\\textcolor{red!nan}{4}"),
            ("boxed-complement-of-black", "\\textcolor{-black}{4}", "\\textcolor{-white}{4}"),
            (
                "boxed-complement-of-mixed-black",
                "\\textcolor{-red!0!black}{4}",
                "\\textcolor{-red!0}{4}",
            ),
            # a colour's definition shows nothing
            ("boxed-definecolor", "\\definecolor{w}{rgb}{1,1,1}", "\\definecolor{w}{rgb}{1,1,1}1"),
            ("boxed-colorlet", "\\colorlet{w}{white}", "\\colorlet{w}{white}x"),
        )
    ),
    # HTML that hides an element (a style, the `hidden` attribute, a white font) or shows no
    # text (`<style>`, `<script>`) hides what the element holds; the same element shown shows it
    *(
        pytest.param(
            tags_format_reward,
            f"<answer>{hidden}</answer>",
            f"<answer>{shown}</answer>",
            id=label,
        )
        for label, hidden, shown in (
            (
                "tags-display-none",
                '<span style="display:none">4</span>',
                '<span style="display:inline">4</span>',
            ),
            (
                "tags-visibility-hidden",
                '<span style="visibility: hidden">4</span>',
                '<span style="visibility: visible">4</span>',
            ),
            (
                "tags-font-size-zero",
                '<span style="font-size:0">4</span>',
                '<span style="font-size:10px">4</span>',
            ),
            (
                "tags-font-size-zero-px",
                "<span style='font-size: 0.0px'>4</span>",
                "<span style='font-size: 0.5em'>4</span>",
            ),
            (
                "tags-opacity-zero",
                '<span style="opacity:0">4</span>',
                '<span style="opacity:0.5">4</span>',
            ),
            (
                "tags-color-white",
                '<span style="color:white">4</span>',
                '<span style="color:red">4</span>',
            ),
            (
                "tags-color-short-hex",
                '<span style="color: #fff">4</span>',
                '<span style="color: #f00">4</span>',
            ),
            (
                "tags-color-long-hex",
                '<span style="color:#FFFFFF">4</span>',
                '<span style="color:#FFFFF0">4</span>',
            ),
            ("tags-hidden-attribute", "<span hidden>4</span>", "<span title=hidden>4</span>"),
            ("tags-unquoted-style", "<p style=display:none>4</p>", "<p style=display:block>4</p>"),
            (
                "tags-last-declaration-wins",
                '<span style="display:inline; DISPLAY: none !important">4</span>',
                '<span style="display:none;display:inline">4</span>',
            ),
            (
                "tags-important-declaration-wins",
                '<span style="display:none!important; display:inline">4</span>',
                '<span style="display:none; display:inline ! important">4</span>',
            ),
            (
                "tags-first-attribute-wins",
                '<span style="display:none" style="">4</span>',
                '<span style="" style="display:none">4</span>',
            ),
            (
                "tags-style-entity",
                '<span style="display&colon;none">4</span>',
                '<span style="display&colon;block">4</span>',
            ),
            ("tags-font-color", '<font color="white">4</font>', '<font color="red">4</font>'),
            (
                "tags-hidden-nested",
                "<div hidden><div>4</div>5</div>",
                "<div hidden><div>4</div></div>5",
            ),
            ("tags-hidden-unclosed", "<span hidden>4", "<span>4"),
            ("tags-style-element", "<style>4</style>", "<style></style>4"),
            ("tags-script-element", "<SCRIPT>x=1</SCRIPT>", "<SCRIPT></SCRIPT>x=1"),
        )
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\color{white}7}",
        "\\boxed{1\\color{white}7}",
        id="boxed-white",
    ),
    *(
        pytest.param(
            tags_format_reward, f"<answer>{empty}</answer>", f"<answer>{empty}4</answer>", id=label
        )
        for label, empty in (
            ("tags-image", "<img src=x>"),
            ("tags-unknown-tag", "<x>"),
            ("tags-ignorespaces", "\\ignorespaces"),
        )
    ),
    pytest.param(boxed_format_reward, "\\boxed{\\,}", "\\boxed{\\,12}", id="boxed-thin-space"),
    pytest.param(boxed_format_reward, "\\boxed{\\;}", "\\boxed{12\\;}", id="boxed-thick-space"),
    pytest.param(boxed_format_reward, "\\boxed{\\quad}", "\\boxed{\\quad x}", id="boxed-quad"),
    pytest.param(boxed_format_reward, "\\boxed{~}", "\\boxed{~-1}", id="boxed-tilde"),
    pytest.param(
        boxed_format_reward, "\\boxed{\\phantom{x}}", "\\boxed{\\phantom{-}1}", id="boxed-phantom"
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\hphantom{12}}",
        "\\boxed{\\hphantom{1}2}",
        id="boxed-hphantom",
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\vphantom{x}}",
        "\\boxed{\\vphantom{x}\\pi}",
        id="boxed-vphantom",
    ),
    pytest.param(
        boxed_format_reward, "\\boxed{\\text{ }}", "\\boxed{\\text{ yes}}", id="boxed-text-space"
    ),
    pytest.param(
        boxed_format_reward, "\\boxed{\\mathrm{}}", "\\boxed{\\mathrm{A}}", id="boxed-mathrm-empty"
    ),
    pytest.param(boxed_format_reward, "\\boxed{{}}", "\\boxed{{7}}", id="boxed-empty-group"),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\displaystyle}",
        "\\boxed{\\displaystyle\\frac{1}{2}}",
        id="boxed-displaystyle",
    ),
    pytest.param(boxed_format_reward, "\\boxed{\u200b}", "\\boxed{\u200b3}", id="boxed-zwsp"),
    pytest.param(
        boxed_format_reward, "\\boxed{\u2060}", "\\boxed{\u2060\\infty}", id="boxed-word-joiner"
    ),
    pytest.param(
        boxed_format_reward, "\\boxed{\ufeff}", "\\boxed{\ufeff\\emptyset}", id="boxed-bom"
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\u00ad\u200c\u200d\u2061}",
        "\\boxed{\u00ad\u200cx\u200d\u2061}",
        id="boxed-format-chars",
    ),
    pytest.param(boxed_format_reward, "\\boxed{\u00a0}", "\\boxed{\u00a0A}", id="boxed-nbsp"),
    pytest.param(
        boxed_format_reward, "\\boxed{\u00a0\u200b}", "\\boxed{\u00a0\u200b0}", id="boxed-nbsp-zwsp"
    ),
    pytest.param(boxed_format_reward, "\\boxed{.}", "\\boxed{0.5}", id="boxed-period"),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\hspace{1cm}}",
        "\\boxed{\\hspace{1cm}5}",
        id="boxed-hspace",
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\left(\\right)}",
        "\\boxed{\\left(1, 2\\right)}",
        id="boxed-sized-delimiters",
    ),
    pytest.param(
        boxed_format_reward,
        "so \\boxed{5} or \\boxed{\\,}",
        "\\boxed{\\,} so \\boxed{5}",
        id="boxed-last-box-read",
    ),
    pytest.param(
        tags_format_reward, "<answer>&nbsp;</answer>", "<answer>&nbsp;4</answer>", id="tags-nbsp"
    ),
    pytest.param(
        tags_format_reward,
        "<answer>&#8203;</answer>",
        "<answer>&#8203;x</answer>",
        id="tags-decimal-entity",
    ),
    pytest.param(
        tags_format_reward,
        "<answer>&#x200B;</answer>",
        "<answer>&#x200B;yes</answer>",
        id="tags-hex-entity",
    ),
    pytest.param(
        tags_format_reward,
        "<answer><!-- x --></answer>",
        "<answer><!-- x -->-1</answer>",
        id="tags-html-comment",
    ),
    pytest.param(
        tags_format_reward,
        "<answer>\\boxed{}</answer>",
        "<answer>\\boxed{\\pi}</answer>",
        id="tags-empty-box",
    ),
    pytest.param(
        tags_format_reward, "<answer> . </answer>", "<answer> 3. </answer>", id="tags-period"
    ),
    pytest.param(
        tags_format_reward,
        "<answer><br></answer>",
        "<answer><b>12</b></answer>",
        id="tags-html-tag",
    ),
    # more constructs that show nothing
    pytest.param(
        boxed_format_reward, "\\boxed{\\kern3pt}", "\\boxed{\\kern3pt 3}", id="boxed-kern"
    ),
    pytest.param(
        boxed_format_reward, "\\boxed{\\\\[2pt]}", "\\boxed{1\\\\[2pt]2}", id="boxed-line-break"
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\begin{pmatrix}\\end{pmatrix}}",
        "\\boxed{\\begin{pmatrix}0\\end{pmatrix}}",
        id="boxed-empty-matrix",
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\textcolor{red}{}}",
        "\\boxed{\\textcolor{red}{5}}",
        id="boxed-colour",
    ),
    pytest.param(
        boxed_format_reward,
        "\\boxed{\\left\\langle\\right\\rangle}",
        "\\boxed{\\left\\langle 1\\right\\rangle}",
        id="boxed-angle-brackets",
    ),
    pytest.param(boxed_format_reward, "\\boxed{\\ldots}", "\\boxed{1, \\ldots}", id="boxed-dots"),
    pytest.param(
        boxed_format_reward, "\\boxed{\\sqrt{}}", "\\boxed{\\sqrt{2}}", id="boxed-empty-root"
    ),
    pytest.param(
        boxed_format_reward, "\\boxed{\u3164}", "\\boxed{\u3164\u221e}", id="boxed-filler"
    ),
    pytest.param(
        tags_format_reward,
        "<answer><!-->.</answer>",
        "<answer><!-->4</answer>",
        id="tags-short-comment",
    ),
    pytest.param(
        tags_format_reward,
        "<answer><br/>&amp;</answer>",
        "<answer><br/>x</answer>",
        id="tags-tag-and-entity",
    ),
    pytest.param(
        think_answer_format_reward,
        "<think>.</think><answer>.</answer>",
        "<think>add them</think><answer>4</answer>",
        id="think-answer-periods",
    ),
    pytest.param(
        think_answer_format_reward,
        "<think>.</think><answer>4</answer>",
        "<think>4</think><answer>4</answer>",
        id="think-answer-empty-think",
    ),
    pytest.param(
        think_answer_format_reward,
        "<think>add them</think><answer>&nbsp;</answer>",
        "<think>add them</think><answer>&nbsp;4</answer>",
        id="think-answer-empty-answer",
    ),
]


@pytest.mark.parametrize(("reward", "empty", "filled"), CONTENT_FREE_CASES)
def test_format_rewards_pay_content_not_structure(reward: Reward, empty: str, filled: str) -> None:
    """A box or tag holding only spacing, phantoms, empty groups or sizing commands, invisible
    characters, white or transparent text, HTML comments, entities, tags or hidden elements, or
    punctuation scores 0.0; the same structure with a letter, digit or mathematical symbol in
    it, or the same text shown, beside it in the batch, scores 1.0."""
    assert reward(["p", "p"], [empty, filled]) == [0.0, 1.0]


@pytest.mark.parametrize(
    "answer",
    ["-1", "x", "\\pi", "\\infty", "\\emptyset", "A", "yes", "<"]
    + ["\\alpha", "\\Omega", "\\leq", "\\neq", "\\sin", "\\to", "\\ell", "\\aleph"],
)
def test_format_rewards_pay_short_answers(answer: str) -> None:
    """A single letter, digit, word, symbol or symbol command (a Greek letter, a relation, an
    operator's name, an arrow) is content in a box and in tags."""
    assert boxed_format_reward(["p"], [f"\\boxed{{{answer}}}"]) == [1.0]
    assert tags_format_reward(["p"], [f"<answer>{answer}</answer>"]) == [1.0]
    completion = f"<think>so</think><answer>{answer}</answer>"
    assert think_answer_format_reward(["p"], [completion]) == [1.0]


# amssymb's and KaTeX's symbol commands, of each class: letters (KaTeX's capital Greek letters
# and number sets among them), relations and their negations, binary operators, arrows, big
# operators, other symbols and operators' names
SYMBOL_COMMANDS = [
    "Alpha", "Omicron", "digamma", "hslash", "eth", "beth", "gimel", "Bbbk",
    "R", "N", "Z", "Q", "C", "Reals",
    "geqq", "leqq", "nleq", "ngeq", "nleqq", "lesssim", "gtrsim", "ncong", "nsubseteq",
    "varsubsetneq", "approxeq", "triangleq", "gtrless", "succcurlyeq", "eqslantgtr", "nparallel",
    "coloneqq", "isin",
    "rtimes", "ltimes", "dagger", "ddagger", "intercal", "barwedge", "bigtriangleup",
    "twoheadrightarrow", "rightsquigarrow", "rArr", "iint", "biguplus",
    "square", "Box", "checkmark", "complement", "sharp", "clubsuit", "bigstar", "blacksquare",
    "vartriangle", "mho", "Finv", "argmax", "arcsin",
]  # fmt: skip


@pytest.mark.parametrize("name", SYMBOL_COMMANDS)
def test_format_rewards_pay_symbol_commands(name: str) -> None:
    """A symbol command of amssymb's or KaTeX's alone (a letter, a relation or its negation, an
    operator, an arrow, another mathematical symbol, an operator's name) is content."""
    assert boxed_format_reward(["p"], [f"\\boxed{{\\{name}}}"]) == [1.0]
    assert tags_format_reward(["p"], [f"<answer>\\{name}</answer>"]) == [1.0]


MEGABYTE = 1 << 20
# Constructs that show nothing, each read past in one step: nested groups, a phantom's argument,
# unclosed optional arguments and comments, spaces a dimension may follow, entities, escapes.
ADVERSARIAL_UNITS = {
    "phantom-nest": "\\phantom{",
    "brace-nest": "{",
    "unclosed-option": "\\rule[",
    "kern-spaces": "\\kern" + " " * 4096,
    "unclosed-comment": "<!--",
    "ampersand-hash": "&#",
    "entity-no-semicolon": "&nbsp",
    "sized-delimiter": "\\left(",
    "line-break": "\\\\",
    "thin-space": "\\,",
    "html-tag": "<b>",
    "html-styled-tag": '<i style="color: red; opacity: .5" title=x>',
    "html-hidden-element": "<s hidden>4</s>",
    "zero-width-space": "\u200b",
    "colour-model": "\\textcolor[rgb]{0.5, 0.5, 0.5}{}",
    "unclosed-colour-model": "\\color[rgb]{",
}


def megabyte_of(units: list[str]) -> str:
    """About a megabyte of `units`, each repeated in a block of its own, with the braces the
    block opens closed after it."""
    blocks = []
    for unit in units:
        block = unit * (MEGABYTE // len(units) // len(unit))
        blocks.append(block + "}" * block.count("{"))
    return "".join(blocks)


@pytest.mark.parametrize("unit", ADVERSARIAL_UNITS.values(), ids=ADVERSARIAL_UNITS.keys())
def test_boxed_format_reward_reads_a_megabyte_box_of_nothing(unit: str) -> None:
    """A megabyte box of one content-free construct, nested or repeated, scores 0.0; a box
    with an answer beside it still scores 1.0."""
    box = f"\\boxed{{{megabyte_of([unit])}}}"
    assert boxed_format_reward(["p", "p"], [box, "\\boxed{7}"]) == [0.0, 1.0]


def test_format_rewards_read_a_megabyte_of_nothing() -> None:
    """A megabyte of every content-free construct in turn (a comment closed) scores 0.0 in
    tags and in a think block; an answer beside it still scores 1.0."""
    units = [unit for unit in ADVERSARIAL_UNITS.values() if unit != "<!--"] + ["<!-- -->"]
    body = megabyte_of(units)
    tagged = [f"<answer>{body}</answer>", "<answer>7</answer>"]
    assert tags_format_reward(["p", "p"], tagged) == [0.0, 1.0]
    thought = [f"<think>{body}</think><answer>7</answer>", "<think>a</think><answer>7</answer>"]
    assert think_answer_format_reward(["p", "p"], thought) == [0.0, 1.0]


def test_overlong_penalty_matches_dapo() -> None:
    lengths = [0, 12, 13, 14, 16, 20]
    scores = overlong_penalty(
        [""] * 6, [""] * 6, max_len=16, buffer=4, factor=1.0, completion_lengths=lengths
    )
    assert scores == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    # character lengths when the trainer's token lengths are absent
    assert overlong_penalty(["", ""], ["abc", "abcdef"], max_len=6, buffer=2, factor=0.5) == [
        0.0,
        -0.5,
    ]
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty([""], [""], max_len=4, buffer=8)


def test_length_penalty() -> None:
    scores = length_penalty([""] * 3, [""] * 3, max_len=10, completion_lengths=[0, 5, 30])
    assert scores == [0.0, -0.5, -1.0]


def test_resolve_reward_import_path_and_errors() -> None:
    name, fn = resolve_reward("oncurve.rewards.format:tags_format_reward")
    assert name == "tags_format_reward"
    assert fn.fn is tags_format_reward and fn.rowwise  # TRL's contract around it, its policy kept
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod'"):
        resolve_reward("no_such_mod:f")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        resolve_reward("oncurve.rewards.format:nope")
    with pytest.raises(ValueError, match="not a built-in"):
        resolve_reward("corect")
