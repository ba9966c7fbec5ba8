"""A sweep's search space and samplers (amlemu.sweeps: space, draw, sampling, bayesian): the YAML and
REST shapes, every distribution's support and type, seeds, sobol, grid, bayesian, and each refusal
as one line naming the field. Pure functions: no home, no processes."""
from __future__ import annotations

import math

import pytest

from amlemu.errors import ConfigError
from amlemu.sweeps.draw import quantize, value_at
from amlemu.sweeps.sampling import (
    SAMPLERS, GridSampler, make_sampler, parse_rest_sampling, parse_sampling, sampling_to_rest, sampling_to_yaml,
    validate_sampling,
)
from amlemu.sweeps.space import (
    Branch, Choice, LogUniform, QUniform, Randint, Uniform, parse_rest_space, parse_space, to_rest_space, to_yaml_dict,
)

YAML = {
    "lr": {"type": "uniform", "min_value": 0.01, "max_value": 0.1},
    "bs": {"type": "choice", "values": [16, 32, 64]},
    "layers": {"type": "randint", "upper": 5},
    "width": {"type": "quniform", "min_value": 16, "max_value": 128, "q": 16},
    "decay": {"type": "loguniform", "min_value": -9.2, "max_value": -2.3},
    "step": {"type": "qloguniform", "min_value": 0, "max_value": 4, "q": 2},
    "noise": {"type": "normal", "mu": 0, "sigma": 1},
    "shift": {"type": "qnormal", "mu": 10, "sigma": 3, "q": 0.5},
    "scale": {"type": "lognormal", "mu": 0, "sigma": 0.5},
    "count": {"type": "qlognormal", "mu": 2, "sigma": 0.5, "q": 1},
    "model": {"type": "choice", "values": [
        {"name": "cnn", "dropout": {"type": "uniform", "min_value": 0.1, "max_value": 0.5}},
        {"name": "mlp", "hidden": {"type": "choice", "values": [64, 128]}},
        "linear"]},
}
# What azure-ai-ml's SweepJob._to_rest_object() sends for the same space (the choice doubly nested).
REST = {
    "lr": ["uniform", [0.01, 0.1]], "bs": ["choice", [[16, 32, 64]]], "layers": ["randint", [5]],
    "width": ["quniform", [16, 128, 16]], "decay": ["loguniform", [-9.2, -2.3]], "step": ["qloguniform", [0, 4, 2]],
    "noise": ["normal", [0, 1]], "shift": ["qnormal", [10, 3, 0.5]], "scale": ["lognormal", [0, 0.5]],
    "count": ["qlognormal", [2, 0.5, 1]],
    "model": ["choice", [[{"name": "cnn", "dropout": ["uniform", [0.1, 0.5]]},
                          {"name": "mlp", "hidden": ["choice", [[64, 128]]]}, "linear"]]],
}


def _run(sampler, n: int, metric=lambda v: None) -> list[dict]:
    history: list = []
    for _ in range(n):
        values = sampler.suggest(history)
        if values is None:
            break
        history.append((values, metric(values)))
    return [v for v, _ in history]


def test_the_yaml_and_rest_shapes_parse_to_the_same_space_and_round_trip() -> None:
    space = parse_space(YAML)
    assert space == parse_rest_space(REST)
    assert space.names == tuple(YAML)
    assert space.as_dict()["width"] == QUniform(16, 128, 16) and space.as_dict()["decay"] == LogUniform(-9.2, -2.3)
    assert space.as_dict()["model"].values[1] == Branch((("name", "mlp"), ("hidden", Choice((64, 128)))))
    assert parse_space(to_yaml_dict(space)) == space and to_yaml_dict(space)["lr"] == YAML["lr"]
    assert to_rest_space(space) == REST
    assert parse_space({"A": {"type": "Uniform", "min_value": 0, "max_value": 1}}).as_dict()["A"] == Uniform(0, 1)


def test_the_sampling_algorithm_in_both_shapes() -> None:
    seeded = parse_sampling({"type": "random", "seed": 7, "rule": "sobol"})
    assert seeded == parse_rest_sampling({"samplingAlgorithmType": "Random", "seed": 7, "rule": "Sobol"})
    assert sampling_to_yaml(seeded) == {"type": "random", "seed": 7, "rule": "sobol"}
    assert parse_rest_sampling(sampling_to_rest(seeded)) == seeded
    grid = parse_sampling("grid")
    assert grid == parse_rest_sampling({"samplingAlgorithmType": "Grid"}) == parse_sampling({"type": "grid"})
    assert sampling_to_yaml(grid) == "grid" and sampling_to_rest(grid) == {"samplingAlgorithmType": "Grid"}
    assert parse_rest_sampling({"samplingAlgorithmType": "Random", "seed": None, "rule": None}) == parse_sampling("random")
    assert set(SAMPLERS) == {"random", "grid", "bayesian"}


@pytest.mark.parametrize("rule", ["random", "sobol"])
def test_every_distribution_samples_inside_its_support_with_its_type(rule: str) -> None:
    values = _run(make_sampler({"type": "random", "seed": 11, "rule": rule}, parse_space(YAML)), 200)
    col = {name: [v[name] for v in values] for name in YAML}
    assert all(isinstance(x, float) and 0.01 <= x <= 0.1 for x in col["lr"])
    assert set(col["bs"]) == {16, 32, 64} and set(col["layers"]) == {0, 1, 2, 3, 4}  # randint: [0, upper)
    assert all(type(x) is int and x % 16 == 0 and 16 <= x <= 128 for x in col["width"])
    assert all(isinstance(x, float) and math.exp(-9.2) <= x <= math.exp(-2.3) for x in col["decay"])  # exponents
    assert all(type(x) is int and x % 2 == 0 and 0 <= x <= 56 for x in col["step"])  # round(exp(u)/2)*2, u in [0, 4]
    assert all(isinstance(x, float) for x in col["noise"]) and min(col["noise"]) < 0 < max(col["noise"])
    assert all(isinstance(x, float) and (x * 2).is_integer() for x in col["shift"])
    assert all(isinstance(x, float) and x > 0 for x in col["scale"])
    assert all(type(x) is int and x >= 0 for x in col["count"])
    kinds = {v["name"] if isinstance(v, dict) else v for v in col["model"]}
    assert kinds == {"cnn", "mlp", "linear"}
    for v in col["model"]:  # a conditional choice: each option's own nested values, and only those
        if v != "linear":
            assert (set(v) == {"name", "dropout"} and v["name"] == "cnn" and 0.1 <= v["dropout"] <= 0.5) or \
                (set(v) == {"name", "hidden"} and v["name"] == "mlp" and v["hidden"] in (64, 128)), v


def test_values_at_known_points_follow_azure_mls_formulas() -> None:
    assert value_at(QUniform(0, 10, 3), 0.5) == 6  # round(5 / 3) * 3
    assert value_at(Randint(5), 0.0) == 0 and value_at(Randint(5), 0.9999) == 4
    assert value_at(LogUniform(-2, 2), 0.0) == pytest.approx(math.exp(-2))
    assert value_at(parse_space({"x": YAML["scale"]}).as_dict()["x"], 0.5) == pytest.approx(1.0)  # exp(mu)
    assert value_at(LogUniform(0, 3), 1 / 3, logbase=10) == pytest.approx(10.0)  # random's logbase
    assert quantize(0.1 + 0.2, 0.1) == 0.3 and quantize(47, 16) == 48


def test_a_seed_reproduces_its_sequence_and_a_restart_continues_it() -> None:
    space = parse_space(YAML)
    for rule in ("random", "sobol"):
        first = _run(make_sampler({"type": "random", "seed": 3, "rule": rule}, space), 6)
        assert _run(make_sampler({"type": "random", "seed": 3, "rule": rule}, space), 6) == first
        assert _run(make_sampler({"type": "random", "seed": 4, "rule": rule}, space), 6) != first
        # A new sampler (a restarted sweep) given the first four trials suggests the fifth.
        assert make_sampler({"type": "random", "seed": 3, "rule": rule}, space).suggest(
            [(v, None) for v in first[:4]]) == first[4]
    assert make_sampler("random", space, seed=9).seed == 9  # unseeded: the runner's seed, recorded


def test_sobol_fills_the_space_evenly_where_random_points_clump() -> None:
    space = parse_space({"x": {"type": "uniform", "min_value": 0, "max_value": 1},
                         "y": {"type": "uniform", "min_value": 0, "max_value": 1}})
    sobol = _run(make_sampler({"type": "random", "seed": 5, "rule": "sobol"}, space), 16)
    plain = _run(make_sampler({"type": "random", "seed": 5}, space), 16)
    # The first 16 points of a scrambled Sobol sequence put exactly one in each sixteenth of each axis.
    for axis in ("x", "y"):
        assert sorted(int(v[axis] * 16) for v in sobol) == list(range(16))
    assert len({int(v["x"] * 16) for v in plain}) < 16  # these seeded random points leave sixteenths empty


def test_grid_walks_the_full_product_in_order_then_stops() -> None:
    space = parse_space({"bs": {"type": "choice", "values": [16, 32]},
                         "model": {"type": "choice", "values": [{"name": "mlp", "hidden": YAML["model"]["values"][1]["hidden"]},
                                                                "linear"]}})
    sampler = make_sampler("grid", space)
    assert isinstance(sampler, GridSampler) and sampler.size == 6
    assert _run(sampler, 10) == [
        {"bs": 16, "model": {"name": "mlp", "hidden": 64}}, {"bs": 16, "model": {"name": "mlp", "hidden": 128}},
        {"bs": 16, "model": "linear"}, {"bs": 32, "model": {"name": "mlp", "hidden": 64}},
        {"bs": 32, "model": {"name": "mlp", "hidden": 128}}, {"bs": 32, "model": "linear"}]
    assert sampler.suggest([({}, None)] * 6) is None


def test_bayesian_stays_in_bounds_and_moves_toward_the_optimum_it_is_told() -> None:
    line = parse_space({"x": {"type": "uniform", "min_value": 0, "max_value": 1}})
    distance = {}
    for goal in ("minimize", "maximize"):  # the same metric, (x - 0.8)^2: near 0.8 when minimized, far when maximized
        values = _run(make_sampler("bayesian", line, goal=goal, seed=2), 30, lambda v: (v["x"] - 0.8) ** 2)
        distance[goal] = [sum(abs(v["x"] - 0.8) for v in part) / 10 for part in (values[:10], values[20:])]
    assert distance["minimize"][1] < distance["minimize"][0] / 2  # the last ten close in on 0.8
    assert distance["maximize"][1] > distance["minimize"][1] * 2
    space = parse_space({"x": {"type": "uniform", "min_value": 0, "max_value": 1},
                         "bs": {"type": "quniform", "min_value": 16, "max_value": 128, "q": 16},
                         "act": {"type": "choice", "values": ["relu", {"name": "leaky", "slope": YAML["lr"]}]}})
    values = _run(make_sampler("bayesian", space, seed=3), 15, lambda v: v["x"])
    assert all(0 <= v["x"] <= 1 and v["bs"] % 16 == 0 and 16 <= v["bs"] <= 128 for v in values)
    assert all(v["act"] == "relu" or 0.01 <= v["act"]["slope"] <= 0.1 for v in values)
    assert {v["act"] == "relu" for v in values} == {True, False}
    # Running trials (no metric) and trials it did not suggest (a restart) are taken in; the same history
    # gives the same suggestion.
    history = [({"x": 0.5, "bs": 48, "act": {"name": "leaky", "slope": 0.05}}, 1.0), ({"x": 0.1, "bs": 16, "act": "relu"}, None)]
    again = make_sampler("bayesian", space, seed=1).suggest(history)
    assert again == make_sampler("bayesian", space, seed=1).suggest(history) and 0 <= again["x"] <= 1


@pytest.mark.parametrize("data, message", [
    ([1], "search_space: must be a non-empty mapping"),
    ({"lr": {"type": "gaussian"}}, "search_space.lr.type: unknown distribution type 'gaussian'; use one of choice,"),
    ({"lr": {"min_value": 1}}, "search_space.lr.type: is missing"),
    ({"lr": {"type": "uniform", "min_value": 1}}, "search_space.lr.max_value: is missing; a uniform takes min_value, max_value"),
    ({"lr": {"type": "uniform", "min_value": 0, "max_value": 1, "q": 2}}, "search_space.lr.q: is not a field of a uniform"),
    ({"n": {"type": "randint", "lower": 0, "upper": 3}}, "search_space.n.lower: is not a field of a randint distribution; a randint takes upper"),
    ({"n": {"type": "randint", "upper": 0}}, "search_space.n.upper: must be a positive integer"),
    ({"n": {"type": "randint", "upper": 2.5}}, "search_space.n.upper: must be a positive integer"),
    ({"lr": {"type": "uniform", "min_value": 0.1, "max_value": 0.01}}, "search_space.lr.min_value: 0.1 is not less than max_value"),
    ({"lr": {"type": "uniform", "min_value": "a", "max_value": 1}}, "search_space.lr.min_value: must be a finite number"),
    ({"w": {"type": "quniform", "min_value": 0, "max_value": 8, "q": 0}}, "search_space.w.q: must be greater than 0"),
    ({"w": {"type": "normal", "mu": 0, "sigma": -1}}, "search_space.w.sigma: must be greater than 0"),
    ({"lr": {"type": "loguniform", "min_value": 0.0001, "max_value": 1000}}, "search_space.lr.max_value: loguniform's bounds are exponents"),
    ({"bs": {"type": "choice", "values": []}}, "search_space.bs.values: must be a non-empty list"),
    ({"bs": {"type": "choice", "values": [[1, 2]]}}, "search_space.bs.values[0]: [1, 2] is not a number, string or mapping"),
    ({"m": {"type": "choice", "values": [{"d": {"type": "uniform", "min_value": 1, "max_value": 0}}]}},
     "search_space.m.values[0].d.min_value: 1 is not less than"),
])
def test_each_bad_yaml_space_is_one_line_naming_the_field(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_space(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("data, message", [
    ({"lr": {"type": "uniform", "min_value": 0, "max_value": 1}}, "searchSpace.lr: must be a two-element list [type, [arguments]]"),
    ({"lr": ["uniform", [0.1]]}, "searchSpace.lr[1]: a uniform takes 2 arguments (min_value, max_value), not 1"),
    ({"bs": ["choice", [16, 32]]}, "searchSpace.bs[1]: a choice's arguments are one list of values"),
    ({"bs": ["beta", [1, 2]]}, "searchSpace.bs[0]: unknown distribution type 'beta'"),
    ({"w": ["qnormal", [0, 1, -1]]}, "searchSpace.w.q: must be greater than 0"),
])
def test_each_bad_rest_space_is_one_line_naming_the_field(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_rest_space(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


CHOICES = {"bs": {"type": "choice", "values": [16, 32]}}


@pytest.mark.parametrize("algorithm, space, message", [
    ("grid", {**CHOICES, "lr": YAML["lr"]}, "sampling_algorithm: grid sampling supports only choice distributions, "
     "and search_space.lr is uniform; make lr a choice, or use random or bayesian sampling"),
    ("grid", {"model": YAML["model"]}, "sampling_algorithm: grid sampling supports only choice distributions, and "
     "search_space.model.values[0].dropout is uniform"),
    ("bayesian", {"lr": YAML["decay"]}, "sampling_algorithm: bayesian sampling supports only choice, uniform and "
     "quniform distributions, and search_space.lr is loguniform; make lr a choice, uniform or quniform, or use random"),
    ("bayesian", {"n": YAML["layers"]}, "sampling_algorithm: bayesian sampling supports only choice, uniform and quniform "
     "distributions, and search_space.n is randint"),
    ({"type": "grid", "seed": 1}, CHOICES, "sampling_algorithm.seed: is not a field of grid sampling; remove it; only random"),
    ({"type": "bayesian", "rule": "sobol"}, CHOICES, "sampling_algorithm.rule: is not a field of bayesian sampling"),
    ({"type": "random", "rule": "halton"}, CHOICES, "sampling_algorithm.rule: unknown rule 'halton'; use random or sobol"),
    ({"type": "random", "seed": -1}, CHOICES, "sampling_algorithm.seed: must be a non-negative integer"),
    ({"type": "random", "seed": "7"}, CHOICES, "sampling_algorithm.seed: must be a non-negative integer"),
    ({"type": "random", "logbase": 1}, CHOICES, "sampling_algorithm.logbase: must be a positive number other than 1"),
    ({"type": "random", "logbase": 10}, {"lr": {"type": "loguniform", "min_value": 0, "max_value": 400}},
     "sampling_algorithm: logbase 10 ** search_space.lr.max_value (400) overflows"),
    ({"type": "random", "sed": 1}, CHOICES, "sampling_algorithm.sed: is not a field of random sampling"),
    ("hyperband", CHOICES, "sampling_algorithm: unknown sampling algorithm 'hyperband'; use random, grid or bayesian"),
    ({"seed": 1}, CHOICES, "sampling_algorithm.type: is missing"),
])
def test_each_refused_combination_is_one_line(algorithm: object, space: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_sampling(algorithm, parse_space(space))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_rest_algorithm_and_the_goal_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^samplingAlgorithm\.samplingAlgorithmType: unknown sampling algorithm 'Hyper'"):
        parse_rest_sampling({"samplingAlgorithmType": "Hyper"})
    with pytest.raises(ConfigError, match=r"^objective\.goal: unknown goal 'up'; use maximize or minimize$"):
        make_sampler("random", parse_space(CHOICES), goal="up")
