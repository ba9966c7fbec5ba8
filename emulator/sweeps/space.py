"""A sweep's search space as Azure ML defines it: pure data, parsed from the CLI v2 YAML shape
(`lr: {type: uniform, min_value: 0.01, max_value: 0.1}`) and from the REST shape azure-ai-ml and
HyperDrive send (`lr: ["uniform", [0.01, 0.1]]`, a choice doubly nested: `["choice", [[16, 32]]]`),
and written back in either shape (job show, the service's GET). A choice's option may be a mapping
of names to values or nested distributions: a conditional (nested) search space.

The log distributions' bounds are exponents, as Azure ML defines them: loguniform's value is
exp(uniform(min_value, max_value)), lognormal's exp(normal(mu, sigma)); the q-variants round the
value to round(value / q) * q."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Union

from amlemu.errors import ConfigError

Scalar = Union[int, float, str, bool]
# exp(709.78) is the largest a float holds; 8 sigma bounds what a lognormal draw reaches (sampling
# clamps its quantiles well inside that).
MAX_EXPONENT = 709.0
LOGNORMAL_SIGMAS = 8.0


@dataclass(frozen=True)
class Branch:
    """One option of a conditional choice: names to scalars or nested distributions, in order."""
    items: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items)


@dataclass(frozen=True)
class Choice:
    values: tuple[Any, ...]  # scalars and Branch options
    type: ClassVar[str] = "choice"


@dataclass(frozen=True)
class Randint:
    upper: int  # a value in [0, upper)
    type: ClassVar[str] = "randint"


@dataclass(frozen=True)
class Uniform:
    min_value: float
    max_value: float
    type: ClassVar[str] = "uniform"


@dataclass(frozen=True)
class LogUniform(Uniform):
    type: ClassVar[str] = "loguniform"


@dataclass(frozen=True)
class QUniform:
    min_value: float
    max_value: float
    q: float
    type: ClassVar[str] = "quniform"


@dataclass(frozen=True)
class QLogUniform(QUniform):
    type: ClassVar[str] = "qloguniform"


@dataclass(frozen=True)
class Normal:
    mu: float
    sigma: float
    type: ClassVar[str] = "normal"


@dataclass(frozen=True)
class LogNormal(Normal):
    type: ClassVar[str] = "lognormal"


@dataclass(frozen=True)
class QNormal:
    mu: float
    sigma: float
    q: float
    type: ClassVar[str] = "qnormal"


@dataclass(frozen=True)
class QLogNormal(QNormal):
    type: ClassVar[str] = "qlognormal"


Distribution = Union[Choice, Randint, Uniform, QUniform, Normal, QNormal]
KINDS: dict[str, type] = {c.type: c for c in (Choice, Randint, Uniform, LogUniform, QUniform, QLogUniform,
                                               Normal, LogNormal, QNormal, QLogNormal)}
LOG_KINDS = frozenset({"loguniform", "qloguniform", "lognormal", "qlognormal"})


@dataclass(frozen=True)
class SearchSpace:
    """The parameters in their declared order (the order grid sampling walks them in)."""
    params: tuple[tuple[str, Any], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)


def names_of(kind: type) -> tuple[str, ...]:
    """A distribution's fields in Azure ML's order: the YAML keys, and the REST list's positions."""
    return tuple(f.name for f in fields(kind))


def _type_list() -> str:
    return ", ".join(KINDS)


def parse_space(data: object, field: str = "search_space") -> SearchSpace:
    """The CLI v2 YAML shape: {name: {type: ..., <the type's fields>}}."""
    return _parse(data, field, rest=False)


def parse_rest_space(data: object, field: str = "searchSpace") -> SearchSpace:
    """The REST shape: {name: [type, [args]]}, a choice's args [[values]]."""
    return _parse(data, field, rest=True)


def _parse(data: object, field: str, rest: bool) -> SearchSpace:
    example = '{"lr": ["uniform", [0.01, 0.1]]}' if rest else "{lr: {type: uniform, min_value: 0.01, max_value: 0.1}}"
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(field, "must be a non-empty mapping of parameter names to distributions", f"e.g. {example}")
    params = []
    for name, spec in data.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(field, f"parameter name {name!r} is not a non-empty string", "name each parameter")
        params.append((name, _parse_dist(spec, f"{field}.{name}", rest)))
    return SearchSpace(tuple(params))


def _parse_dist(spec: object, field: str, rest: bool) -> Any:
    kind, args = _rest_parts(spec, field) if rest else _yaml_parts(spec, field)
    if kind is Choice:
        return _choice(args.get("values"), f"{field}.values", rest)
    values = {}
    for name in names_of(kind):
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{field}.{name}", f"must be a finite number, not {value!r}")
        values[name] = int(value) if kind is Randint and value == int(value) else value
    dist = kind(**values)
    _check(dist, field)
    return dist


def _kind(name: object, field: str) -> type:
    kind = KINDS.get(name.lower()) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError(field, f"unknown distribution type {name!r}", f"use one of {_type_list()}")
    return kind


def _yaml_parts(spec: object, field: str) -> tuple[type, dict[str, Any]]:
    if not isinstance(spec, Mapping):
        raise ConfigError(field, "must be a mapping with a type", "e.g. {type: choice, values: [16, 32]}")
    if "type" not in spec:
        raise ConfigError(f"{field}.type", "is missing", f"use one of {_type_list()}")
    kind = _kind(spec["type"], f"{field}.type")
    expected = names_of(kind)
    for key in spec:
        if key != "type" and key not in expected:
            raise ConfigError(f"{field}.{key}", f"is not a field of a {kind.type} distribution",
                              f"a {kind.type} takes {', '.join(expected)}")
    for key in expected:
        if key not in spec:
            raise ConfigError(f"{field}.{key}", "is missing", f"a {kind.type} takes {', '.join(expected)}")
    return kind, {key: spec[key] for key in expected}


def _rest_parts(spec: object, field: str) -> tuple[type, dict[str, Any]]:
    if not (isinstance(spec, (list, tuple)) and len(spec) == 2 and isinstance(spec[1], (list, tuple))):
        raise ConfigError(field, f"must be a two-element list [type, [arguments]], not {spec!r}",
                          'e.g. ["uniform", [0.01, 0.1]] or ["choice", [[16, 32]]]')
    kind = _kind(spec[0], f"{field}[0]")
    args = list(spec[1])
    if kind is Choice:
        if len(args) != 1 or not isinstance(args[0], (list, tuple)):
            raise ConfigError(f"{field}[1]", "a choice's arguments are one list of values", 'e.g. ["choice", [[16, 32]]]')
        return kind, {"values": list(args[0])}
    expected = names_of(kind)
    if len(args) != len(expected):
        raise ConfigError(f"{field}[1]", f"a {kind.type} takes {len(expected)} arguments ({', '.join(expected)}), "
                          f"not {len(args)}")
    return kind, dict(zip(expected, args))


def _is_rest_dist(value: object) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str)
            and value[0].lower() in KINDS and isinstance(value[1], (list, tuple)))


def _choice(values: object, field: str, rest: bool) -> Choice:
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(field, "must be a non-empty list", "e.g. values: [16, 32, 64]")
    options = []
    for i, value in enumerate(values):
        if isinstance(value, Mapping):
            options.append(_branch(value, f"{field}[{i}]", rest))
        elif isinstance(value, (int, float, str)) and not (isinstance(value, float) and not math.isfinite(value)):
            options.append(value)
        else:
            raise ConfigError(f"{field}[{i}]", f"{value!r} is not a number, string or mapping",
                              "a choice's values are numbers, strings, or mappings of nested parameters")
    return Choice(tuple(options))


def _branch(value: Mapping[Any, Any], field: str, rest: bool) -> Branch:
    if not value:
        raise ConfigError(field, "is an empty mapping", "give the option's parameters, e.g. {model: resnet, lr: 0.1}")
    items = []
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(field, f"key {key!r} is not a non-empty string", "name each nested parameter")
        nested = _is_rest_dist(item) if rest else isinstance(item, Mapping)
        if nested:
            items.append((key, _parse_dist(item, f"{field}.{key}", rest)))
        elif isinstance(item, (int, float, str)):
            items.append((key, item))
        else:
            raise ConfigError(f"{field}.{key}", f"{item!r} is not a number, string or distribution",
                              "a nested parameter is a value or a distribution")
    return Branch(tuple(items))


def _check(dist: Any, field: str) -> None:
    """The rules that hold for a distribution whatever the shape it came in."""
    if isinstance(dist, Randint):
        if not isinstance(dist.upper, int) or dist.upper < 1:
            raise ConfigError(f"{field}.upper", f"must be a positive integer, not {dist.upper!r}",
                              "randint draws an integer in [0, upper)")
    if isinstance(dist, (Uniform, QUniform)) and not dist.min_value < dist.max_value:
        raise ConfigError(f"{field}.min_value", f"{dist.min_value} is not less than max_value {dist.max_value}",
                          "swap them, or use a choice for a single value")
    if isinstance(dist, (QUniform, QNormal)) and dist.q <= 0:
        raise ConfigError(f"{field}.q", f"must be greater than 0, not {dist.q}", "q is the step values are rounded to")
    if isinstance(dist, (Normal, QNormal)) and dist.sigma <= 0:
        raise ConfigError(f"{field}.sigma", f"must be greater than 0, not {dist.sigma}")
    if dist.type in LOG_KINDS:
        top, name = ((dist.max_value, "max_value") if isinstance(dist, (Uniform, QUniform))
                     else (dist.mu + LOGNORMAL_SIGMAS * dist.sigma, "mu"))
        if top > MAX_EXPONENT:
            raise ConfigError(f"{field}.{name}", f"{dist.type}'s bounds are exponents (value = exp({top:g}) overflows)",
                              f"give the logarithms of the values, e.g. min_value: {math.log(1e-4):.2f} for 1e-4")


def to_yaml_dict(space: SearchSpace) -> dict[str, Any]:
    """The CLI v2 YAML shape (job show): parse_space(to_yaml_dict(s)) == s."""
    return {name: _dist_yaml(dist) for name, dist in space.params}


def _dist_yaml(dist: Any) -> dict[str, Any]:
    if isinstance(dist, Choice):
        return {"type": "choice", "values": [_option(v, _dist_yaml) for v in dist.values]}
    return {"type": dist.type, **{name: getattr(dist, name) for name in names_of(type(dist))}}


def to_rest_space(space: SearchSpace) -> dict[str, Any]:
    """The REST shape (what the service answers azure-ai-ml with): parse_rest_space(to_rest_space(s)) == s."""
    return {name: _dist_rest(dist) for name, dist in space.params}


def _dist_rest(dist: Any) -> list[Any]:
    if isinstance(dist, Choice):
        return ["choice", [[_option(v, _dist_rest) for v in dist.values]]]
    return [dist.type, [getattr(dist, name) for name in names_of(type(dist))]]


def _option(value: Any, write: Any) -> Any:
    if isinstance(value, Branch):
        return {k: (write(v) if isinstance(v, tuple(KINDS.values())) else v) for k, v in value.items}
    return value


def leaves(space: SearchSpace) -> list[tuple[str, Any]]:
    """Every distribution, nested ones too, as (path, distribution) in a fixed depth-first order:
    `lr`, and `model.values[1].lr` for a nested parameter of a choice's second option."""
    out: list[tuple[str, Any]] = []

    def walk(path: str, dist: Any) -> None:
        out.append((path, dist))
        if isinstance(dist, Choice):
            for i, option in enumerate(dist.values):
                for key, value in option.items if isinstance(option, Branch) else ():
                    if isinstance(value, tuple(KINDS.values())):
                        walk(f"{path}.values[{i}].{key}", value)

    for name, dist in space.params:
        walk(name, dist)
    return out
