"""Format rewards and length penalties.

Lengths: every length-based function reads the `completion_lengths` column (tokens, as the
trainer passes it from the rollout) when present, else falls back to the character length of
the completion; `max_len` and `buffer` are in the same unit as the lengths used.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Sequence
from html import unescape
from html.entities import html5
from typing import Any

from oncurve.rewards.extraction import answer_region, extract_answer

_TAG_RE = re.compile(r"</?(?:think|answer)>", re.IGNORECASE)
_WELL_FORMED_TAGS = ["<think>", "</think>", "<answer>", "</answer>"]


def _names(names: str) -> frozenset[str]:
    return frozenset(names.split())


# What `_has_content` reads. A letter or digit (Unicode's, less the Hangul fillers: letters
# that show nothing) or an ASCII mathematical symbol but `<`, which may start a tag.
_CONTENT_RE = re.compile(r"[^\W_\u115f\u1160\u3164\uffa0]|[+=>|]")
# Where a construct starts: a command, an entity, a tag or comment. A backslash before a space
# or punctuation that shows nothing (`\,` `\;` `\:` `\!` `\ ` `\-` `\/` `\@`) starts none, nor
# an `&` before no entity: they are read as plain text, in one step with what surrounds them.
# `~` is plain text too.
_CONSTRUCT_RE = re.compile(r"\\(?![,;:! \t\n\r/@-])|&(?=#[0-9]|#[xX][0-9a-fA-F]|[a-zA-Z])|<|%")
_COMMAND_RE = re.compile(r"\\(?:([a-zA-Z]+)|(.))", re.DOTALL)
_ENTITY_RE = re.compile(r"&(?:#(?:[xX][0-9a-fA-F]+|[0-9]+);?|([a-zA-Z][a-zA-Z0-9]*)(;?))")
_HTML_TAG_RE = re.compile(r"</?([a-zA-Z][a-zA-Z0-9]*)(?:[\s/][^<>]*)?>")
_BRACE_RE = re.compile(r"\\.|[{}]", re.DOTALL)
_SPACE_RE = re.compile(r"\s*")
# An optional argument. It holds no bracket: a search for the `]` of an unclosed `[` stops at
# the next `[`, so that `\rule[\rule[...` is read in one pass.
_OPTION_RE = re.compile(r"\[[^\[\]]*\]")
# A TeX dimension or glue (`3pt`, `-1.5 em`, `1em plus 1fil`). Possessive quantifiers: adjacent
# optional spaces would otherwise split a long run of them in polynomially many ways.
_DIMEN = (
    r"\s*+=?\s*+[-+]?\s*+(?:[0-9]++(?:[.,][0-9]*+)?|[.,][0-9]++)\s*+(?:true\s*+)?"
    r"(?:pt|pc|in|bp|cm|mm|dd|cc|sp|em|ex|mu|px|fil{1,3}+)?+"
)
_DIMENSION_RE = re.compile(rf"{_DIMEN}(?:\s*+(?:plus|minus){_DIMEN}){{0,2}}")
# The commands that show content of their own, a letter or a mathematical symbol (as plain text
# shows, `_shows_characters`): TeX's letters and logos, and KaTeX's math symbols (its
# `symbols.js`, amssymb's among them) of the letter, ordinary, binary, relation and big-operator
# classes, its operators' names and its macros for such symbols (`\R`, `\Alpha`, `\ne`,
# `\rarr`), less those that show punctuation, currency or a unit (`\S`, `\P`, `\pounds`,
# `\yen`, `\degree`, `\And`, `\backslash`) or an ellipsis. Any other command shows nothing
# itself: spacing, style and size switches, page layout (`\newpage`, `\centering`), wrappers
# (`\text`, `\boxed`, `\frac`, accents: their arguments are read as the rest of the text is),
# delimiters (`\langle`), ellipses (`\cdots`), punctuation and currency (`\textdollar`) and
# commands of no known meaning (`\foo`).
_SYMBOL_COMMANDS = _names(
    # Greek letters (KaTeX's capitals that are Latin letters, `\Alpha`, among them)
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta thetasym iota kappa "
    "varkappa lambda mu nu xi omicron pi varpi rho varrho sigma varsigma tau upsilon phi varphi "
    "chi psi omega digamma Alpha Beta Gamma varGamma Delta varDelta Epsilon Zeta Eta Theta "
    "varTheta Iota Kappa Lambda varLambda Mu Nu Xi varXi Omicron Pi varPi Rho Sigma varSigma "
    "Tau Upsilon varUpsilon Phi varPhi Chi Psi varPsi Omega varOmega "
    # other letters (Latin, Hebrew, script, turned) and TeX's logos
    "i j l L o O ss ae AE oe OE aa AA ell hbar hslash imath jmath eth Re Im real image wp "
    "weierp Bbbk alef alefsym aleph beth gimel daleth Finv Game TeX LaTeX KaTeX "
    # number sets (KaTeX's, and `\Q` `\C` as commonly defined)
    "C cnums Complex N natnums Q R Reals reals Z "
    # binary operators
    "amalg ast barwedge bigcirc bigtriangledown bigtriangleup boxdot boxminus boxplus boxtimes "
    "bull bullet Cap cap cdot centerdot circ circledast circledcirc circleddash Cup cup "
    "curlyvee curlywedge Dagger dagger ddagger diamond div divideontimes dotplus doublebarwedge "
    "doublecap doublecup gtrdot intercal land leftthreetimes lessdot lhd lor ltimes mp odot "
    "ominus oplus oslash otimes plusmn pm rhd rightthreetimes rtimes sdot setminus "
    "smallsetminus sqcap sqcup star times triangleleft triangleright unlhd unrhd uplus vee "
    "veebar wedge wr "
    # relations, negated relations among them
    "approx approxcolon approxcoloncolon approxeq asymp backepsilon backsim backsimeq because "
    "between blacktriangleleft blacktriangleright bowtie Bumpeq bumpeq circeq Colonapprox "
    "colonapprox coloncolonapprox coloncolonequals coloncolonminus coloncolonsim Coloneq "
    "coloneq Coloneqq coloneqq colonequals colonminus Colonsim colonsim cong curlyeqprec "
    "curlyeqsucc dashv Doteq doteq doteqdot eqcirc Eqcolon eqcolon Eqqcolon eqqcolon eqsim "
    "eqslantgtr eqslantless equalscolon equalscoloncolon equiv fallingdotseq frown ge geq geqq "
    "geqslant gg ggg gggtr gnapprox gneq gneqq gnsim gt gtrapprox gtreqless gtreqqless gtrless "
    "gtrsim gvertneqq imageof in isin Join le leq leqq leqslant lessapprox lesseqgtr lesseqqgtr "
    "lessgtr lesssim ll lll llless lnapprox lneq lneqq lnsim lt lvertneqq mid minuscolon "
    "minuscoloncolon models ncong ne neq ngeq ngeqq ngeqslant ngtr ni nleq nleqq nleqslant "
    "nless nmid notin notni nparallel nprec npreceq nshortmid nshortparallel nsim nsubseteq "
    "nsubseteqq nsucc nsucceq nsupseteq nsupseteqq ntriangleleft ntrianglelefteq ntriangleright "
    "ntrianglerighteq nVDash nVdash nvDash nvdash origof owns parallel perp pitchfork prec "
    "precapprox preccurlyeq preceq precnapprox precneqq precnsim precsim propto risingdotseq "
    "shortmid shortparallel sim simcolon simcoloncolon simeq smallfrown smallsmile smile "
    "sqsubset sqsubseteq sqsupset sqsupseteq sub sube Subset subset subseteq subseteqq "
    "subsetneq subsetneqq succ succapprox succcurlyeq succeq succnapprox succneqq succnsim "
    "succsim supe Supset supset supseteq supseteqq supsetneq supsetneqq therefore thickapprox "
    "thicksim trianglelefteq triangleq trianglerighteq varpropto varsubsetneq varsubsetneqq "
    "varsupsetneq varsupsetneqq vartriangle vartriangleleft vartriangleright Vdash vDash vdash "
    "Vvdash "
    # arrows
    "circlearrowleft circlearrowright curvearrowleft curvearrowright Darr dArr darr "
    "dashleftarrow dashrightarrow Downarrow downarrow downdownarrows downharpoonleft "
    "downharpoonright gets Harr hArr harr hookleftarrow hookrightarrow iff impliedby implies "
    "Larr lArr larr leadsto Leftarrow leftarrow leftarrowtail leftharpoondown leftharpoonup "
    "leftleftarrows Leftrightarrow leftrightarrow leftrightarrows leftrightharpoons "
    "leftrightsquigarrow Lleftarrow Longleftarrow longleftarrow Longleftrightarrow "
    "longleftrightarrow longmapsto Longrightarrow longrightarrow looparrowleft looparrowright "
    "Lrarr lrArr lrarr Lsh mapsto multimap nearrow nLeftarrow nleftarrow nLeftrightarrow "
    "nleftrightarrow nRightarrow nrightarrow nwarrow Rarr rArr rarr restriction Rightarrow "
    "rightarrow rightarrowtail rightharpoondown rightharpoonup rightleftarrows "
    "rightleftharpoons rightrightarrows rightsquigarrow Rrightarrow Rsh searrow swarrow to "
    "twoheadleftarrow twoheadrightarrow Uarr uArr uarr Uparrow uparrow Updownarrow updownarrow "
    "upharpoonleft upharpoonright upuparrows "
    # big operators
    "bigcap bigcup bigodot bigoplus bigotimes bigsqcup biguplus bigvee bigwedge coprod iiint "
    "iint int intop oiiint oiint oint prod smallint sum "
    # other symbols
    "angle backprime bigstar blacklozenge blacksquare blacktriangle blacktriangledown bot Box "
    "checkmark circledR circledS clubs clubsuit complement dag ddag diagdown diagup Diamond "
    "diamonds diamondsuit empty emptyset exist exists flat forall hearts heartsuit infin infty "
    "lnot lozenge maltese measuredangle mho nabla natural neg nexists partial prime sharp "
    "spades spadesuit sphericalangle square surd top triangle triangledown varnothing Vert vert "
    # operators' names
    "arccos arcctg arcsin arctan arctg arg argmax argmin bmod ch cos cosec cosh cot cotg coth "
    "csc ctg cth deg det dim exp gcd hom inf injlim ker lg lim liminf limsup ln log max min mod "
    "plim Pr projlim sec sh sin sinh sup tan tanh tg th varinjlim varliminf varlimsup "
    "varprojlim"
)
# A colour that hides what it applies to: white or transparent, by name (xcolor's and CSS's),
# in hexadecimal (`#fff`, `#ffffff80`, `#00000000`; KaTeX takes six digits without `#` too), as
# an xcolor mix (`red!0`, `_mix_hides`) or in a colour model (`\textcolor[rgb]{1,1,1}`); and a
# zero scale.
_HIDING_NAMES = frozenset(("white", "transparent"))
_HEX_COLOUR_RE = re.compile(r"#([0-9a-f]{3,4}|[0-9a-f]{6}|[0-9a-f]{8})|([0-9a-f]{6})")
# Each colour model's white, channel by channel: a value at or above it when it is a range's
# top (`rgb`'s 1, `HSB`'s brightness 240), at or below 0 (`cmyk`'s inks, a saturation), any
# value where it is None (a hue). A value beyond a range counts as the range's end: PDF clamps
# a colour to its range.
_WHITE_IN_MODEL: dict[str, tuple[float | None, ...]] = {
    "rgb": (1.0, 1.0, 1.0),
    "RGB": (255.0, 255.0, 255.0),
    "gray": (1.0,),
    "Gray": (15.0,),
    "cmyk": (0.0, 0.0, 0.0, 0.0),
    "cmy": (0.0, 0.0, 0.0),
    "hsb": (None, 0.0, 1.0),
    "Hsb": (None, 0.0, 1.0),
    "tHsb": (None, 0.0, 1.0),
    "HSB": (None, 0.0, 240.0),
}
_COMPONENT_SEPARATOR_RE = re.compile(r"\s*,\s*|\s+")
_DECIMAL_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")  # a mix's percentage
_MAX_COLOUR_CHARS = 64  # a longer colour argument is no colour of a model's (and is not parsed)
_ZERO_SCALE_RE = re.compile(r"\{\s*[-+]?0*\.?0*\s*\}")
# Mathematical symbols that are not an answer alone: ellipses (`⋯`, `⋮`) and a bare minus.
_NOT_CONTENT_SYMBOLS = frozenset("\u22ee\u22ef\u22f0\u22f1\u2212")
# Size commands and the delimiter each sizes (`\left(`, `\right.`, `\bigl\langle`).
_SIZERS = frozenset(
    ["left", "right", "middle"]
    + [size + end for size in ("big", "Big", "bigg", "Bigg") for end in ("", "l", "r", "m")]
)
_DELIMITERS = _names(
    "langle rangle lvert rvert vert Vert lVert rVert lfloor rfloor lceil rceil lbrace rbrace "
    "lbrack rbrack lgroup rgroup lmoustache rmoustache uparrow downarrow updownarrow Uparrow "
    "Downarrow Updownarrow backslash"
)
# Commands whose first arguments (how many) are not shown: phantoms, space, colours, labels.
_HIDDEN_ARGUMENTS = {
    "phantom": 1,
    "hphantom": 1,
    "vphantom": 1,
    "hspace": 1,
    "vspace": 1,
    "mspace": 1,
    "color": 1,
    "pagecolor": 1,
    "textcolor": 1,
    "colorbox": 1,
    "fcolorbox": 2,
    "label": 1,
    "footnote": 1,
    "tag": 1,
    "raisebox": 1,
    "scalebox": 1,
    "rotatebox": 1,
    "resizebox": 2,
    "rule": 2,
    "makebox": 0,
    "framebox": 0,
    "href": 1,
    "begin": 1,
    "end": 1,
    "index": 1,
    "pagestyle": 1,
    "thispagestyle": 1,
    "newcommand": 2,
    "renewcommand": 2,
    "def": 2,
    "setcounter": 2,
    "setlength": 2,
    "definecolor": 3,
    "providecolor": 3,
    "colorlet": 2,
}
# An environment whose column specification (`{c|c}`) follows its name.
_COLUMN_SPEC_RE = re.compile(r"\{\s*(?:array|tabular|subarray)\s*\}")
_DIMENSIONED = frozenset(("kern", "mkern", "hskip", "vskip", "mskip", "hglue", "vglue"))
# `\,` `\;` `\:` `\!` `\>` `\ ` `\/` `\-` `\@`, and accents (`\'`, `\=`, `\^`) on what
# follows them
_SHOWS_NOTHING_SYMBOLS = frozenset(",;:!> \t\n\r/-@'\"`^~=.")
_DELIMITER_SYMBOLS = frozenset("()[]|./<>")
# HTML elements whose content shows no text, and those that hold no content (`<br>`).
_TEXTLESS_ELEMENTS = _names("script style template")
_VOID_ELEMENTS = _names("area base br col embed hr img input link meta source track wbr")
# An attribute of a tag, its value quoted or not (`hidden`, `style="color: white"`).
_ATTRIBUTE_RE = re.compile(r"""([^\s"'<>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'<>=`]+)))?""")
_CSS_ZERO_RE = re.compile(r"[-+]?(?:0+(?:\.0*)?|\.0+)(?:[a-z]+|%)?")


def think_answer_format_reward(
    prompts: list[str], completions: list[str], **columns: Any
) -> list[float]:
    """1.0 when the completion is exactly `<think>...</think><answer>...</answer>`: each tag once,
    in that order, only whitespace outside them, and content inside both (`_has_content`: a
    letter, digit or mathematical symbol; a block of punctuation, spacing or invisible characters
    is structure without content), else 0.0. A prompt that ends with `<think>` (the R1-Zero
    template) has opened the tag for the completion, so the completion then starts inside it."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if prompt.rstrip().endswith("<think>"):
            completion = "<think>" + completion
        scores.append(1.0 if _think_then_answer(completion) else 0.0)
    return scores


def boxed_format_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 when the last outermost balanced `\\boxed{...}` (`\\boxed{\\frac{1}{2}}` included) of
    the part of the completion `correct` reads (`answer_region`: after the reasoning, outside
    fenced programs) shows content, a letter, digit or mathematical symbol (`_has_content`),
    else 0.0: `\\boxed{\\,}`, `\\boxed{\\phantom{x}}`, `\\boxed{.}` and a box in the reasoning
    followed by an answer without one score 0.0, `\\boxed{\\pi}` and `\\boxed{-1}` 1.0."""
    return [_scores_content(extract_answer(answer_region(c)[0], "boxed")) for c in completions]


def tags_format_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 when the last `<answer>...</answer>` pair of the part of the completion `correct`
    reads (`answer_region`: after the reasoning, outside fenced programs), the pair `correct`
    takes its answer from, shows content (`_has_content`), else 0.0: `<answer>&nbsp;</answer>`,
    `<answer>\\boxed{}</answer>`, `<answer> . </answer>` and a pair in the reasoning followed by
    an answer without one score 0.0, `<answer>4</answer>` 1.0."""
    return [_scores_content(extract_answer(answer_region(c)[0], "tags")) for c in completions]


def _scores_content(answer: str | None) -> float:
    return 1.0 if answer is not None and _has_content(answer) else 0.0


def _think_then_answer(completion: str) -> bool:
    tags = list(itertools.islice(_TAG_RE.finditer(completion), len(_WELL_FORMED_TAGS) + 1))
    if [tag.group().lower() for tag in tags] != _WELL_FORMED_TAGS:
        return False
    think_open, think_close, answer_open, answer_close = tags
    outside = (
        completion[: think_open.start()]
        + completion[think_close.end() : answer_open.start()]
        + completion[answer_close.end() :]
    )
    return (
        not outside.strip()
        and _has_content(completion[think_open.end() : think_close.start()])
        and _has_content(completion[answer_open.end() : answer_close.start()])
    )


def _has_content(text: str) -> bool:
    """Whether `text` shows something: a letter, a digit or a mathematical symbol (Unicode's
    letters, numbers and math symbols; a symbol command, `_SYMBOL_COMMANDS`: `\\pi`, `\\le`,
    `\\sin`; `-1`, `yes`), once what shows nothing is read past: LaTeX spacing (`\\,` `\\;`
    `\\quad` `~` `\\hspace{..}` `\\kern 3pt`), every other command (`\\newpage`, `\\foo`), with
    the arguments it does not show (`\\index{4}`, `\\newcommand{\\x}{4}`), style, size and
    wrapper commands around nothing (`\\displaystyle`, `\\left(\\right)`, `\\text{ }`,
    `\\mathrm{}`, `\\boxed{}`), white or transparent text, by name, as an xcolor mix or in
    a colour model (`\\textcolor[rgb]{1,1,1}{4}`, `\\textcolor{red!0}{4}`, `_is_white`) and
    zero-scaled text, empty groups, phantoms with their argument, format and space characters
    (U+200B, U+FEFF, no-break space), HTML comments, entities (`&nbsp;`, `&#8203;`,
    `&#x200B;`) and tags (`<br>`), HTML elements that hide what they hold, with it
    (`<span style="display:none">4</span>`, `<span hidden>`, `<style>`, `_read_tag`), and
    punctuation (`.`, `,`). Each character is read a bounded number of times."""
    pos, end = 0, len(text)
    while pos < end:
        construct = _CONSTRUCT_RE.search(text, pos)
        stop = end if construct is None else construct.start()
        if _shows_characters(text, pos, stop):
            return True
        if construct is None:
            return False
        pos, shows = _read_construct(text, stop)
        if shows:
            return True
    return False


def _shows_characters(text: str, start: int, stop: int) -> bool:
    """Whether `text[start:stop]`, plain text, holds a letter, digit or math symbol."""
    if start >= stop:
        return False
    if _CONTENT_RE.search(text, start, stop):
        return True
    plain = text[start:stop]
    if plain.isascii():
        return False
    return any(  # `∞`, `∅`
        c > "\x7f" and unicodedata.category(c) == "Sm" and c not in _NOT_CONTENT_SYMBOLS
        for c in plain
    )


def _read_construct(text: str, pos: int) -> tuple[int, bool]:
    """(where it ends, whether it shows something) of the construct at `pos`: a LaTeX command,
    an HTML comment, tag or entity; a `<` or `&` that starts none is a character."""
    char = text[pos]
    if char == "%":  # a LaTeX comment: the rest of its line
        newline = text.find("\n", pos)
        return (len(text) if newline < 0 else newline + 1), False
    if char == "&":
        entity = _ENTITY_RE.match(text, pos)
        if entity is not None and (entity[1] is None or entity[1] + entity[2] in html5):
            return entity.end(), False
        return pos + 1, False  # `&` is punctuation; the name after it is read as text
    if char == "<":
        if text.startswith("<!--", pos):
            close = text.find("-->", pos + 2)  # `<!-->` is a comment too
            return (len(text) if close < 0 else close + 3), False  # unclosed: hides the rest
        tag = _HTML_TAG_RE.match(text, pos)
        if tag is not None:  # an element shows its content, not its tags (`<img>` no text)
            return _read_tag(text, tag), False
        return pos + 1, True  # less-than
    return _read_command(text, pos)


def _read_tag(text: str, tag: re.Match[str]) -> int:
    """Where the HTML tag `tag` ends; where the element it opens ends (its closing tag, nested
    elements of its name counted; unclosed, the text's end) when that element shows nothing of
    what it holds: `<script>`, `<style>` and `<template>`, or one its attributes hide
    (`_attributes_hide`)."""
    name = tag[1].lower()
    attributes = text[tag.end(1) : tag.end() - 1]
    opens = text[tag.start() + 1] != "/" and name not in _VOID_ELEMENTS
    hides = name in _TEXTLESS_ELEMENTS or (attributes != "" and _attributes_hide(name, attributes))
    if not opens or not hides:
        return tag.end()
    depth = 0
    same_name = re.compile(rf"<(/?){name}(?=[\s/>])[^<>]*>", re.IGNORECASE)
    for same in same_name.finditer(text, tag.end()):
        depth += -1 if same[1] else 1
        if depth < 0:
            return same.end()
    return len(text)


def _attributes_hide(name: str, attributes: str) -> bool:
    """Whether `attributes` (a tag's text after its name) hide what the HTML element `name`
    holds: the `hidden` attribute, `<font color="white">`, an inline style that hides
    (`_style_hides`). Attribute values are read with their character references decoded
    (`display&colon;none`), as a browser reads them; of a repeated attribute, the first."""
    values: dict[str, str] = {}
    for attribute in _ATTRIBUTE_RE.finditer(attributes):
        value = next((v for v in attribute.groups()[1:] if v is not None), "")
        values.setdefault(attribute[1].lower(), unescape(value))
    return (
        "hidden" in values
        or (name == "font" and _colour_hides(values.get("color", "").lower()))
        or ("style" in values and _style_hides(values["style"].lower()))
    )


def _style_hides(style: str) -> bool:
    """Whether the lower-case inline CSS `style` hides its element's text: by the last
    declaration of each property (an `!important` one before any other) `display: none`,
    `visibility: hidden` or `collapse`, a zero `font-size` or `opacity`, or a white or
    transparent `color` (`_colour_hides`)."""
    values: dict[str, str] = {}
    important: set[str] = set()
    for declaration in style.split(";"):
        prop, colon, value = (part.strip() for part in declaration.partition(":"))
        before, bang, flag = value.rpartition("!")
        is_important = bool(bang) and flag.strip() == "important"
        if not colon or (not is_important and prop in important):
            continue
        if is_important:
            value = before.strip()
            important.add(prop)
        values[prop] = value
    return (
        values.get("display") == "none"
        or values.get("visibility") in ("hidden", "collapse")
        or _CSS_ZERO_RE.fullmatch(values.get("font-size", "-")) is not None
        or _CSS_ZERO_RE.fullmatch(values.get("opacity", "-")) is not None
        or _colour_hides(values.get("color", ""))
    )


def _read_command(text: str, pos: int) -> tuple[int, bool]:
    """(where it ends, whether it shows something) of the LaTeX command at `pos`."""
    command = _COMMAND_RE.match(text, pos)
    if command is None:  # a trailing backslash
        return pos + 1, False
    name, symbol, after = command[1], command[2], command.end()
    if name is None:
        if symbol == "\\":  # a line break, with its spacing (`\\[2pt]`)
            return _skip_options(text, after), False
        if symbol in _SHOWS_NOTHING_SYMBOLS:
            return after, False
        return after, _shows_characters(symbol, 0, 1)  # `\{`, `\%`, `\|`
    if name == "iffalse":  # skipped to its `\fi`
        close = text.find("\\fi", after)
        return (len(text) if close < 0 else close + 3), False
    if name in ("color", "textcolor", "scalebox") and _hides(name, text, after):
        # white text, or a zero scale: what it applies to shows nothing
        after = _skip_argument(text, _skip_options(text, after))
        if name == "color":
            return _group_end(text, after), False
        return _skip_argument(text, after), False
    if name in _SIZERS:
        return _skip_delimiter(text, after), False
    if name in _HIDDEN_ARGUMENTS:
        hidden = _HIDDEN_ARGUMENTS[name]
        if name == "begin" and _COLUMN_SPEC_RE.match(text, _SPACE_RE.match(text, after).end()):
            hidden = 2  # the environment's name and its column specification
        after = _skip_options(text, after)
        for _ in range(hidden):
            after = _skip_argument(text, _skip_options(text, after))
        return after, False
    if name in _DIMENSIONED:
        after = _SPACE_RE.match(text, after).end()
        if text.startswith("{", after):
            return _skip_argument(text, after), False
        dimension = _DIMENSION_RE.match(text, after)
        return (after if dimension is None else dimension.end()), False
    return after, name in _SYMBOL_COMMANDS  # `\pi`, `\le`, `\sin`; not `\newpage`


def _hides(name: str, text: str, pos: int) -> bool:
    """Whether the colour or scale argument at `pos` (after its optional colour model, as in
    `\\textcolor[rgb]{1,1,1}`) hides what follows it."""
    pos = _SPACE_RE.match(text, pos).end()
    option = _OPTION_RE.match(text, pos)
    model = "" if option is None else option.group()[1:-1].strip()
    pos = _skip_options(text, pos)
    argument = text[pos : _skip_argument(text, pos)]
    if name == "scalebox":
        return _ZERO_SCALE_RE.fullmatch(argument.strip()) is not None
    return _is_white(model, argument.strip("{} \t\n"))


def _is_white(model: str, colour: str) -> bool:
    """Whether `colour`, in xcolor's `model` ("" for a colour's name or mix), is white or
    transparent: `white`, `#fff`, `red!0` (`_colour_hides`, `_mix_hides`), `rgb` 1,1,1, `RGB`
    255,255,255, `HTML` FFFFFF, `gray` 1, `Gray` 15, `cmyk` 0,0,0,0, `hsb` ?,0,1, `HSB`
    ?,0,240 (`_WHITE_IN_MODEL`)."""
    if len(colour) > _MAX_COLOUR_CHARS:
        return False
    if not model:
        return _colour_hides(colour.lower()) or _mix_hides(colour.lower())
    if model == "HTML":
        return _colour_hides(colour.lower())
    white = _WHITE_IN_MODEL.get(model)
    if white is None:
        return False
    try:
        components = [float(c) for c in _COMPONENT_SEPARATOR_RE.split(colour)]
    except ValueError:
        return False
    return len(components) == len(white) and all(
        end is None or (value <= end if end == 0 else value >= end)
        for value, end in zip(components, white, strict=True)
    )


def _colour_hides(colour: str) -> bool:
    """Whether the lower-case CSS or KaTeX colour `colour` is white or transparent: `white`,
    `transparent`, hexadecimal white (`#fff`, `#ffffff`, `ffffff`, with any alpha) or any
    hexadecimal colour of alpha 0 (`#0000`, `#00000000`)."""
    if colour in _HIDING_NAMES:
        return True
    hexadecimal = _HEX_COLOUR_RE.fullmatch(colour)
    if hexadecimal is None:
        return False
    digits = hexadecimal[1] or hexadecimal[2]
    if len(digits) <= 4:
        digits = "".join(digit * 2 for digit in digits)
    return digits[:6] == "ffffff" or digits[6:] == "00"


def _mix_hides(expression: str) -> bool:
    """Whether xcolor's lower-case colour `expression` is white: `c!p` is p% of c and the rest
    white, `c!p!d` p% of c and the rest d, a longer chain mixes its result so on left to right,
    and a leading `-` takes the complement. The mix is white when each colour it takes a share
    of is (`red!0`, `white!100`, `red!0!white`, `red!50!blue!0`); its complement when each is
    black (`-black`, `-red!0!black`). A percentage beyond 0..100 counts as the range's end."""
    complement = False
    while expression.startswith("-"):
        complement = not complement
        expression = expression[1:]
    parts = [part.strip() for part in expression.split("!")]
    colours, percentages = parts[0::2], parts[1::2]
    if len(percentages) == len(colours):  # `c!p`: the rest is white
        colours.append("white")
    if not all(_DECIMAL_RE.fullmatch(p) for p in percentages):
        return False
    shares = [min(max(float(p) / 100, 0.0), 1.0) for p in percentages]
    # each colour's share of the result: the first takes every share, each later one the rest
    # of the share before it, times every share after it
    weights = [1.0] * len(colours)
    for i, share in enumerate(shares):
        weights[: i + 1] = [weight * share for weight in weights[: i + 1]]
        weights[i + 1] = 1.0 - share
    hiding = "black" if complement else "white"
    return all(
        colour == hiding for colour, weight in zip(colours, weights, strict=True) if weight > 0
    )


def _group_end(text: str, pos: int) -> int:
    """Where the brace group around `pos` closes (a `\\color`'s reach), else the text's end."""
    depth = 0
    for brace in _BRACE_RE.finditer(text, pos):
        if brace.group() == "{":
            depth += 1
        elif brace.group() == "}":
            if depth == 0:
                return brace.start()
            depth -= 1
    return len(text)


def _skip_options(text: str, pos: int) -> int:
    """Past a star and optional `[...]` arguments at `pos` (`\\hspace*`, `\\rule[1pt]`)."""
    while True:
        pos = _SPACE_RE.match(text, pos).end()
        if text.startswith("*", pos):
            pos += 1
        elif (option := _OPTION_RE.match(text, pos)) is not None:
            pos = option.end()
        else:
            return pos


def _skip_argument(text: str, pos: int) -> int:
    """Past the argument at `pos`: a balanced `{...}` group (to the end when unclosed), a
    command or one character."""
    pos = _SPACE_RE.match(text, pos).end()
    if pos >= len(text):
        return pos
    if text[pos] == "{":
        depth = 0
        for brace in _BRACE_RE.finditer(text, pos):
            if brace.group() == "{":
                depth += 1
            elif brace.group() == "}":
                depth -= 1
                if depth == 0:
                    return brace.end()
        return len(text)
    command = _COMMAND_RE.match(text, pos)
    return pos + 1 if command is None else command.end()


def _skip_delimiter(text: str, pos: int) -> int:
    """Past the delimiter a size command sizes (`(`, `.`, `\\{`, `\\langle`), if one is at
    `pos`; a letter, a digit or any other command is left to be read."""
    pos = _SPACE_RE.match(text, pos).end()
    if pos < len(text) and text[pos] in _DELIMITER_SYMBOLS:
        return pos + 1
    command = _COMMAND_RE.match(text, pos)
    if command is not None and (command[2] is not None or command[1] in _DELIMITERS):
        return command.end()
    return pos


def length_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    max_len: int = 1024,
    completion_lengths: Sequence[int] | None = None,
    **columns: Any,
) -> list[float]:
    """`-min(length, max_len) / max_len`, in [-1, 0]: a linear push toward short completions;
    scale it with the reward's weight."""
    _check_positive(max_len=max_len)
    return [-min(n, max_len) / max_len for n in _lengths(completions, completion_lengths)]


def overlong_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    max_len: int = 1024,
    buffer: int = 256,
    factor: float = 1.0,
    completion_lengths: Sequence[int] | None = None,
    **columns: Any,
) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to `max_len - buffer`,
    then falling linearly to `-factor` at `max_len`, and `-factor` beyond."""
    _check_positive(max_len=max_len, buffer=buffer)
    if buffer > max_len:
        raise ValueError(f"overlong_penalty: buffer ({buffer}) must not exceed max_len ({max_len})")
    free = max_len - buffer
    scores = []
    for n in _lengths(completions, completion_lengths):
        if n <= free:
            scores.append(0.0)
        elif n <= max_len:
            scores.append(factor * (free - n) / buffer)
        else:
            scores.append(-factor)
    return scores


def _lengths(completions: list[str], completion_lengths: Sequence[int] | None) -> list[int]:
    if completion_lengths is None:
        return [len(c) for c in completions]
    if len(completion_lengths) != len(completions):
        raise ValueError(
            f"completion_lengths has {len(completion_lengths)} entries for "
            f"{len(completions)} completions"
        )
    return [int(n) for n in completion_lengths]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
