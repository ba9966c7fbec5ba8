"""Import costs put off (emulator/lazydeps.py): azure-ai-ml loads without compiling rfc3987_syntax's
grammars, and jsonschema's IRI format check, when one runs, still judges as before."""
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
