"""Import costs put off (emulator/lazydeps.py): azure-ai-ml loads without compiling rfc3987_syntax's
grammars (inspect.stack(), which azure-ai-ml's experimental warnings call, does not load them either),
and jsonschema's IRI format check, when one runs, still judges as before."""
from __future__ import annotations

import json
import os
import subprocess
import sys

# In a fresh interpreter: nothing imported yet, as in a CLI call.
PROBE = """
import json, sys
from amlemu.jobs import sdk2
sdk2.require()
import inspect
inspect.stack()  # as azure-ai-ml's experimental warnings do: it asks every module for __file__
loaded = "rfc3987_syntax.syntax_helpers" in sys.modules
import jsonschema
checker = jsonschema.FormatChecker()
verdicts = [checker.conforms(v, "iri") for v in ("https://例え.jp/パス?q=1", "http://[bad")]
references = [checker.conforms(v, "iri-reference") for v in ("../a b", "ok/パス")]
import rfc3987_syntax
print(json.dumps({"loaded_by_azure_ai_ml": loaded, "iri": verdicts, "iri_reference": references,
                  "terms": "iri" in rfc3987_syntax.RFC3987_SYNTAX_TERMS}))
"""


def test_azure_ai_ml_loads_without_the_iri_grammars_and_an_iri_check_still_judges() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"loaded_by_azure_ai_ml": False, "iri": [True, False], "iri_reference": [False, True],
                     "terms": True}


def test_the_docker_sdk_comes_without_its_ssh_transport_unless_docker_host_asks_for_ssh() -> None:
    probe = ("import sys; from amlemu.lazydeps import import_docker; d = import_docker(); "
             "print('paramiko' in sys.modules, hasattr(d.transport, 'SSHHTTPAdapter')); "
             "import paramiko; print(paramiko.__name__)")  # a later import of it still works
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout
    assert plain.split() == ["False", "False", "paramiko"]
    ssh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**env, "DOCKER_HOST": "ssh://user@example.invalid"}).stdout
    assert ssh.split() == ["True", "True", "paramiko"]


def test_the_cli_and_the_service_load_without_numpy_and_a_random_sweep_still_draws() -> None:
    """numpy (~0.2 CPU-s of a CLI call's ~1 s start) is imported where a trial is drawn, not by every
    `amlemu` call and service start; a seeded random trial draws the same values as before."""
    probe = ("import sys, json; import amlemu.cli, amlemu.service.server; before = 'numpy' in sys.modules; "
             "from amlemu.sweeps.sampling import RandomSampler, parse_sampling; "
             "from amlemu.sweeps.space import parse_space; "
             "space = parse_space({'lr': {'type': 'uniform', 'min_value': 0, 'max_value': 1}}); "
             "s = RandomSampler(space, parse_sampling({'type': 'random', 'seed': 7})); "
             "import numpy; print(json.dumps([before, s.suggest([])['lr'], "
             "float(numpy.random.default_rng([7, 0]).random())]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    before, drawn, expected = json.loads(done.stdout.strip().splitlines()[-1])
    assert before is False, "numpy is imported by the CLI's or the service's import path again"
    assert drawn == expected
