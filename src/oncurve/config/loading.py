"""A Config from YAML and `key=value` overrides: the layers merged in order, each value coerced
to its field's type and checked, then the checks across fields."""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from oncurve.config.presets import (
    BUNDLED_MODEL_DEFAULTS,
    ESTIMATOR_DEFAULTS,
    PRESET_SHARES,
    PRESETS,
    mark_preset_applied,
)
from oncurve.config.sections import Config, RewardFnConfig, RolloutConfig
from oncurve.config.validation import check_cross_fields, check_given_settings
from oncurve.data.files import first_surrogate
from oncurve.errors import UserError

# Keys that were renamed or moved, old dotted key -> new dotted key: a config that still uses
# one stops with a line naming the new key. A future rename is one more line here.
RENAMED: dict[str, str] = {
    "rewards": "reward.functions",
    "run.reward_timeout": "reward.timeout",
    "run.reward_timeout_score": "reward.timeout_score",
    "run.reward_errors": "reward.errors",
    "algo.overlong_buffer": "reward.overlong_buffer",
    "algo.overlong_penalty": "reward.overlong_penalty",
    "algo.tis_cap": "algo.is_cap",
}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Config from defaults, the preset, an optional YAML file and `key=value` overrides: the
    user's settings, so one that the rest leaves without effect is refused
    (`check_given_settings`). A run's own config.yaml, settled at its start, loads with
    `load_run_config`."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(Path(path))
    for item in overrides or []:
        key, value = _parse_override(item)
        _set_dotted(raw, key, value)
    config = build_config(raw)
    baseline = _from_dict(Config, _defaults(raw), "")
    given = {key for key in _dotted_keys(raw) if _value(config, key) != _value(baseline, key)}
    check_given_settings(config, given)
    return config


def load_run_config(path: str | Path) -> Config:
    """The config a run saved (its config.yaml: every setting, the ones left null settled at
    its start, `algo.is_cap` say). A run writes every section, so a file that lacks one (cut
    short, emptied, or not a run's) is refused in one line naming it: its defaults would stand
    in for the run's settings."""
    path = Path(path)
    raw = _read_yaml(path)
    if not raw:
        raise UserError(f"config file {path} is empty; a run's config.yaml holds every section")
    missing = [f.name for f in dataclasses.fields(Config) if f.name not in raw]
    if missing:
        raise UserError(
            f"config file {path} lacks {', '.join(missing)}; a run's config.yaml holds every "
            "section (this one was cut short or edited)"
        )
    return build_config(raw)


def build_config(raw: dict[str, Any]) -> Config:
    """Config from a nested dict (YAML layout), with the preset applied below the user's keys."""
    config = _from_dict(Config, _merge(_defaults(raw), raw), "")
    check_cross_fields(config)
    mark_preset_applied(config.algo)
    return config


def with_model_path(config: Config, path: str) -> Config:
    """`config` training the model at `path` in place of the bundled one (`model.path`
    `default`). A config made in Python holds a real model's defaults and gets the path alone;
    one that holds a bundled model's default (`BUNDLED_MODEL_DEFAULTS`: optim.lr 1e-4,
    rollout.max_new_tokens 64, as loading gives where the file sets nothing) is refused in one
    line: which of its settings are the user's is not known, and loading it with the path
    gives a real model's defaults."""
    held = [
        f"{section}.{key}={value!r}"
        for section, keys in BUNDLED_MODEL_DEFAULTS.items()
        for key, value in keys.items()
        if getattr(getattr(config, section), key) == value
    ]
    if held:
        raise UserError(
            f"model: the config, loaded for the bundled model (model.path default), holds its "
            f"{held[0]}; load it with the model's path: "
            f"oncurve.load_config(path, ['model.path={path}', ...]), or pass train the YAML "
            "file's path"
        )
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=path))


def _defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """What `raw`'s settings land on: the bundled model's (when `model.path` is `default`),
    the preset's (its `PRESET_SHARES` sized by the rollout.max_new_tokens that `raw` comes
    to) and the estimator's defaults."""
    if not isinstance(raw, dict):
        raise UserError(f"config must be a mapping of sections, got {_type_name(raw)}")
    _check_renamed(raw)
    algo = raw.get("algo")
    user_algo = algo if isinstance(algo, dict) else {}
    preset = user_algo.get("preset", "grpo")
    if preset not in PRESETS:
        raise UserError(f"algo.preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    model = raw.get("model")
    bundled = (model.get("path", "default") if isinstance(model, dict) else "default") == "default"
    merged = _merge(BUNDLED_MODEL_DEFAULTS if bundled else {}, PRESETS[preset])
    estimator = user_algo.get("estimator", merged["algo"]["estimator"])
    if isinstance(estimator, str):
        merged = _merge(merged, {"algo": ESTIMATOR_DEFAULTS.get(estimator, {})})
    return _merge(merged, _shares(PRESET_SHARES.get(preset, {}), raw, merged))


def _shares(
    shares: dict[str, dict[str, Any]], raw: dict[str, Any], below: dict[str, Any]
) -> dict[str, dict[str, int]]:
    """`shares` (a preset's `PRESET_SHARES`) as settings: each its share, rounded up, of the
    rollout.max_new_tokens that `raw` over `below` comes to; none where the rollout section is
    not valid (building the config then says why)."""
    if not shares:
        return {}
    rollout = _merge(below, raw).get("rollout")
    try:
        tokens = _from_dict(RolloutConfig, {} if rollout is None else rollout, "rollout.")
    except UserError:
        return {}
    return {
        section: {key: math.ceil(share * tokens.max_new_tokens) for key, share in keys.items()}
        for section, keys in shares.items()
    }


def _dotted_keys(raw: dict[str, Any], prefix: str = "") -> set[str]:
    """The dotted names of the settings `raw` gives (its sections' keys, not the sections)."""
    keys = set()
    for key, value in raw.items():
        if isinstance(value, _Given) and isinstance(value.parsed, dict):  # `model.lora={...}`
            value = value.parsed
        if isinstance(value, dict) and f"{prefix}{key}" in _SECTIONS:
            keys |= _dotted_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def _value(config: Config, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part, None)
    return node


def _sections(cls: type, prefix: str = "") -> set[str]:
    """The dotted names of the config's sections (`model`, `model.lora`, ...)."""
    names = set()
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            names |= {f"{prefix}{name}"} | _sections(hint, f"{prefix}{name}.")
    return names


_SECTIONS = _sections(Config)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s keys on top, mappings merged key by key (copies, neither changed)."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            out[key] = _merge(below, value)
        else:
            out[key] = dict(value) if isinstance(value, dict) else value
    return out


def _check_renamed(raw: dict[str, Any]) -> None:
    """A one-line error for the first key of `raw` that `RENAMED` lists."""
    for old, new in RENAMED.items():
        *sections, key = old.split(".")
        node: Any = raw
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node:
            same_name = key == new.rsplit(".", 1)[-1]
            raise UserError(f"{old} {'moved to' if same_name else 'was renamed'} {new}")


def to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict of every field (what `config.yaml` in a run directory holds)."""
    return dataclasses.asdict(config)


def config_yaml(config: Config) -> str:
    """`config` as the YAML a run's config.yaml holds (`to_dict`: every section)."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def save_config(config: Config, path: Path) -> None:
    """Write `config` to `path` as YAML (`config_yaml`)."""
    path.write_text(config_yaml(config))


class _DuplicateKey(Exception):
    """A key given twice in one mapping of a config file, at `line`."""

    def __init__(self, key: object, line: int) -> None:
        super().__init__(key, line)
        self.key, self.line = key, line


class _IntText(int):
    """An integer as YAML read it, with the text it was written as: a text field takes the
    text (`run.dir: 007` is "007", `log.wandb.name: 12:30` is "12:30", not 7 and 750)."""

    text: str

    def __new__(cls, value: int, text: str) -> _IntText:
        number = super().__new__(cls, value)
        number.text = text
        return number


class _FloatText(float):
    """A float as YAML read it, with the text it was written as (`_IntText`)."""

    text: str

    def __new__(cls, value: float, text: str) -> _FloatText:
        number = super().__new__(cls, value)
        number.text = text
        return number


class _TextKeepingLoader(yaml.SafeLoader):
    """YAML's safe loader, whose numbers keep the text they were written as (`_IntText`,
    `_FloatText`); `_plain` turns them back into ints and floats."""


def _construct_int(loader: _TextKeepingLoader, node: yaml.ScalarNode) -> _IntText:
    try:
        value = loader.construct_yaml_int(node)
    except ValueError:  # more digits than Python converts from text (4300); Decimal has no cap
        value = int(decimal.Decimal(node.value.replace("_", "")))
    return _IntText(value, node.value)


def _construct_float(loader: _TextKeepingLoader, node: yaml.ScalarNode) -> _FloatText:
    return _FloatText(loader.construct_yaml_float(node), node.value)


_TextKeepingLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_TextKeepingLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _plain(value: Any) -> Any:
    """`value` with the numbers `_TextKeepingLoader` made (`_IntText`, `_FloatText`) as plain
    ints and floats, in lists and mappings too (what a config holds and `yaml.safe_dump`
    writes)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


class _UniqueKeyLoader(_TextKeepingLoader):
    """`_TextKeepingLoader`, refusing a key given twice in one mapping (which `safe_load` would
    read as the last one, dropping the first silently). Merge keys (`<<: *base`) work as in
    `safe_load`: a key of the mapping's own wins over a merged one."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # merged keys may repeat the mapping's own: those win, as in safe_load
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, typing.Hashable):
            continue  # construct_mapping refuses it
        if key in seen:
            raise _DuplicateKey(key, key_node.start_mark.line + 1)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise UserError(
            f"config file {path} is a directory (a YAML file comes first; settings as key=value)"
        )
    if not path.exists():
        raise UserError(f"config file {path} does not exist")
    try:
        # a pipe too: bash's process substitution, `oncurve train <(sed ... base.yaml)`
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError:
        raise UserError(f"config file {path} is not UTF-8 text") from None
    except OSError as err:  # no permission to read it, say
        raise UserError(f"config file {path} cannot be read: {err.strerror or err}") from None
    except _DuplicateKey as err:
        raise UserError(f"config file {path} line {err.line}: {err.key!r} is given twice") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(
            f"config file {path}{where} is not valid YAML ({_yaml_problem(err)})"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of sections")
    return data


def _yaml_problem(err: yaml.YAMLError) -> str:
    """What YAML found wrong in a config file, in one line; a tab, which YAML refuses as
    indentation, said plainly."""
    problem = str(getattr(err, "problem", None) or err).splitlines()[0]
    if problem.startswith("found character '\\t'"):
        return "a tab: YAML indents with spaces"
    return problem


class _Given(str):
    """An override's text that YAML reads as something else (`parsed`: a number, a boolean, a
    date, null, a list or mapping, or the text cut at a ` #` comment): a text field takes the
    text as written (`run.dir=007` stays "007", `data.system_prompt=Answer: a number` and
    `run.dir=runs/exp #2` stay whole), except `null` or `~`; any other field YAML's reading,
    and a list or mapping field an error when YAML cannot read it (`invalid`)."""

    parsed: Any
    invalid: str | None = None


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UserError(f"override {item!r} must look like section.key=value")
    given = _Given(text)
    try:
        given.parsed = yaml.load(text, Loader=_TextKeepingLoader) if text else ""
    except yaml.YAMLError as err:
        given.parsed = text
        given.invalid = str(getattr(err, "problem", None) or err).splitlines()[0]
    quoted = text.strip()[:1] in ("'", '"')
    if given.invalid is None and isinstance(given.parsed, str) and (given.parsed == text or quoted):
        return key.strip(), given.parsed  # plain text, or text quoted to be taken as text
    return key.strip(), given


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` of `raw` to `value`. A mapping given for a section (`run={steps: 5}`)
    is merged into the section's settings so far, section by section, the mapping's keys
    winning; any other value replaces what was there."""
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:  # a section left empty in YAML (`model:`) is an empty one
            child = {}
        elif isinstance(child, _Given) and isinstance(child.parsed, dict):
            child = child.parsed
        if isinstance(child, list):
            raise UserError(f"{key}: {'.'.join(parts[:-1])} is a list; set it whole, [...]")
        if not isinstance(child, dict):
            raise UserError(f"{key}: {part} is not a section")
        # a copy: a YAML alias (`trackio: *wandb`) shares one mapping between two places
        node[part] = child = dict(child)
        node = child
    mapping = value.parsed if isinstance(value, _Given) else value
    if key in _SECTIONS and isinstance(mapping, dict):
        below = node.get(parts[-1])
        if isinstance(below, _Given) and isinstance(below.parsed, dict):
            below = below.parsed
        value = _merge_sections(below if isinstance(below, dict) else {}, mapping, key)
    node[parts[-1]] = value


def _merge_sections(base: dict[str, Any], over: dict[str, Any], section: str) -> dict[str, Any]:
    """`base` with `over`'s keys on top, both the settings of `section`: a subsection is
    merged key by key, any setting (a mapping one such as `data.task_options` too) replaced."""
    out = dict(base)
    for key, value in over.items():
        below, name = out.get(key), f"{section}.{key}"
        if isinstance(below, _Given) and isinstance(below.parsed, dict):
            below = below.parsed
        if name in _SECTIONS and isinstance(value, dict) and isinstance(below, dict):
            out[key] = _merge_sections(below, value, name)
        else:
            out[key] = value
    return out


def _from_dict(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a mapping, got {_type_name(raw)}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            choices = ", ".join(known)
            hint = _meant(key, known, prefix)
            raise UserError(f"unknown key {prefix}{key}{hint}; {where} has: {choices}")
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(hints[name], value, f"{prefix}{name}", known[name])
    return cls(**values)


def _settings(cls: type, prefix: str = "") -> dict[str, list[str]]:
    """Each setting's name (a section's key) -> the dotted keys of the settings so named."""
    names: dict[str, list[str]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            for setting, keys in _settings(hint, f"{prefix}{name}.").items():
                names.setdefault(setting, []).extend(keys)
        else:
            names.setdefault(name, []).append(f"{prefix}{name}")
    return names


_SETTING_NAMES = _settings(Config)


def _meant(key: Any, known: dict[str, Any], prefix: str) -> str:
    """What an unknown `key` of the section at `prefix` (its keys `known`) likely meant, as
    " (...)" for its error line: a key of the section spelled alike, else the settings of that
    name in other sections; "" when neither."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    if close:
        return f" (did you mean {prefix}{close[0]}?)"
    elsewhere = _SETTING_NAMES.get(str(key), [])
    return f" ({' or '.join(elsewhere)} has that name)" if elsewhere else ""


def _coerce(hint: Any, value: Any, name: str, spec: dataclasses.Field, item: bool = False) -> Any:
    """`value` as field `spec` (named `name`) takes it, type `hint`, checked; `item`: an item
    of the list field `spec`. UserError naming the field for a value it refuses."""
    if isinstance(value, _Given):
        args = typing.get_args(hint)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        text_field = hint is str or (union and str in args)
        # a list of text given one item (`rollout.stop=42`) takes it as written too
        text_item = typing.get_origin(hint) is list and args == (str,)
        text_item = text_item and not isinstance(value.parsed, list)
        if value.invalid and not text_field and value.lstrip()[:1] in ("[", "{"):
            raise UserError(f"{name}: {str(value)!r} is not valid YAML ({value.invalid})")
        if value.strip() in ("null", "Null", "NULL", "~"):
            value = None
        elif text_field or text_item:
            value = str(value)
        else:
            value = value.parsed
    if dataclasses.is_dataclass(hint):
        if hint is RewardFnConfig:
            # an item of reward.functions: null is no reward (a section's null is its defaults)
            if value is None:
                raise UserError(f"{name} must be a reward name or a mapping, got null")
            if isinstance(value, str):
                _check_text(value, name, spec, optional=False, item=item)
                value = {"name": value}
        return _from_dict(hint, value if value is not None else {}, name + ".")
    origin = typing.get_origin(hint)
    optional = False
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        optional = True
        hint = options[0]
        origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise UserError(f"{name} must be a mapping of names to values, got {_shown(value)}")
        # a dotted override into it (`data.task_options.counts=[3]`) is read as YAML reads it
        mapping = _plain({k: v.parsed if isinstance(v, _Given) else v for k, v in value.items()})
        _refuse_surrogate(mapping, name)
        check = spec.metadata.get("check")
        problem = check(mapping) if check else None
        if problem:
            raise UserError(f"{name} {problem}, got {_shown(mapping)}")
        return mapping
    if origin is list:
        (item_hint,) = typing.get_args(hint)
        if value is None:  # `reward.functions:` left empty in YAML, or null
            empty = spec.metadata.get("empty_list", "none")
            raise UserError(f"{name} must be a list, got null; [] for {empty}")
        if isinstance(value, dict):
            # one reward spec as a mapping is a list of one; any other mapping is a dotted key
            # into the list (`reward.functions.weight=2`)
            if not (dataclasses.is_dataclass(item_hint) and "name" in value):
                raise UserError(f"{name} is a list; set it whole: {name}=[...]")
            value = [value]
        if not isinstance(value, list):  # one item given alone is named as the field
            return [_coerce(item_hint, value, name, spec, item=True)]
        return [_coerce(item_hint, v, f"{name}[{i}]", spec, item=True) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return _coerce(hint, value, name, spec)
    value = _scalar(hint, value, name)
    if isinstance(value, str):
        _check_text(value, name, spec, optional, item)
    choices = spec.metadata.get("choices")
    if choices and value not in choices:
        raise UserError(
            f"{name} must be one of {', '.join(map(str, choices))}, got {_shown(value)}"
        )
    check = spec.metadata.get("check")
    problem = check(value) if check else None
    if problem:
        raise UserError(f"{name} {problem}, got {_shown(value)}")
    if isinstance(value, float) and math.isnan(value):  # a check of its own lets nothing through
        raise UserError(f"{name} must be a number, got nan")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT_MAX:
        # no setting counts past 64 bits (torch and numpy take none wider)
        raise UserError(f"{name} must be between -(2**63 - 1) and 2**63 - 1, got {_shown(value)}")
    return value


_INT_MAX = 2**63 - 1


def _check_text(value: str, name: str, spec: dataclasses.Field, optional: bool, item: bool) -> None:
    """A one-line error for text holding a surrogate (`_refuse_surrogate`), and for empty text
    where the field refuses it (its `blank` metadata: whitespace-only text too, unless
    `whitespace`), saying what to give instead: null for an `optional` field, [] for a list's
    `item`."""
    _refuse_surrogate(value, name)
    blank = spec.metadata.get("blank", "refuse")
    if blank == "allow" or (value.strip() if blank == "refuse" else value):
        return
    if item:
        instead = f" ([] for {spec.metadata.get('empty_list', 'none')})"
    elif optional:
        instead = " (null for the default)" if spec.default is None else " (null for none)"
    else:
        instead = ""
    raise UserError(f"{name} must not be empty{instead}, got {value!r}")


def _refuse_surrogate(value: Any, name: str) -> None:
    """A one-line error naming setting `name` when text in `value` (a mapping's keys and
    values, a list's items, at any depth) holds a surrogate: no Unicode character (tokenizers
    and UTF-8 writers refuse it), which YAML's `\\ud800` escape and a command line's
    undecodable byte give."""
    if found := first_surrogate(value):
        raise UserError(
            f"{name} holds a surrogate \\u{ord(found):04x}, which is no Unicode character"
        )


def _shown(value: Any) -> str:
    """`value` as an error line shows it: repr, but the size of an integer too long to read
    (Python refuses to print one of over 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a {int(math.log10(abs(value))) + 1}-digit number"
    return repr(_plain(value))


def _refuse_yaml11_number(value: int | float, name: str) -> None:
    """A one-line error naming setting `name` when `value` was written in a form only YAML 1.1
    reads as that number (`_IntText`, `_FloatText` keep the text): a leading zero, octal there
    (`010` is 8), or base 60 (`1:30` is 90). YAML 1.2 and a reader take `010` for ten and
    `1:30` for no number; `0o10`, `0x10` and `0b10` say their base and stay numbers."""
    text = getattr(value, "text", None)
    if text is None:
        return
    digits = text.replace("_", "").lstrip("+-")
    if ":" in text:
        kind = "base 60"
    elif len(digits) > 1 and digits[0] == "0" and digits.isdigit() and int(digits) != abs(value):
        kind = "octal"
    else:
        return
    raise UserError(
        f"{name}: {text!r} is ambiguous (YAML 1.1 reads it as {kind}, {_shown(value)}); write "
        "the number in decimal"
    )


def _type_name(value: Any) -> str:
    """The YAML-ish type name of `value`: a number read from YAML is an int or a float."""
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def _scalar(hint: type, value: Any, name: str) -> Any:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint in (int, float) and number:
        _refuse_yaml11_number(value, name)
    if hint is float and isinstance(value, str):
        # YAML 1.1 reads `1e-5` (no dot) as a string; users mean the number.
        try:
            return float(value)
        except ValueError:
            pass
    if hint is float and number:
        try:
            return float(value)
        except OverflowError:  # an integer beyond float's range
            raise UserError(f"{name} must be a finite number, got {_shown(value)}") from None
    if hint is str and number:
        # a number in a YAML file keeps the text it was written as (`run.dir: 007`)
        text = getattr(value, "text", None)
        if text is None:
            raise UserError(f"{name} must be text, got the number {_shown(value)}")
        return text
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise UserError(f"{name} must be {hint.__name__}, got {_type_name(value)} {_shown(value)}")
    return int(value) if hint is int else value
