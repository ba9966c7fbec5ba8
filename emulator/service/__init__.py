"""`amlemu serve`: Azure ML's own REST API on this machine, backed by the emulator, so unmodified
azure-ai-ml and azureml-core code runs on emulated nodes. Four parts, each with its own job (the
import contracts in pyproject.toml hold the arrows: server -> mlflowmount -> protocol -> state):

- protocol/: what goes over the wire. routes.py lists every v2 route (ARM, jobs, computes, codes,
  environments, datastores) and builds the app's route table; v1routes.py (experiments, startrun,
  snapshots), v1online.py (a v1 run's history: metrics, artifacts), v1widget.py (the notebook
  widget's reads); sweeproutes.py, pipelineroutes.py (a job PUT's dispatch: sweeps, pipelines) and
  componentroutes.py (ml_client.components.*); datablobs.py and blocks.py the blob endpoint;
  assetroutes.py data and model assets; calls.py (a handler's Call and Reply), endpoint.py (the
  request wrapper: sizes, auth, bounded bodies), bodies.py, auth.py (tokens, signed URLs), linkguard.py (what a job's link may
  reach), health.py.
- state/: the workspace behind the routes, no web framework: the State protocol the routes call
  (__init__.py: every capability, the optional ones included; ServiceError; the code and
  environment registry; blob stores), emulator.py (that protocol over the real emulator),
  jobrest.py (a job's REST body <-> the CLI v2 YAML the emulator reads), computerest.py (a
  compute's), v1.py (SDK v1 runs) and v1history.py (what their jobs' Run objects send),
  runblobs.py (the run files and datastores jobs.download reads); sweeprest.py/sweepstate.py,
  pipelinerest.py/pipelinestate.py and componentrest.py/componentstate.py (a sweep's, a pipeline's
  and a component's REST body <-> the YAML the emulator reads, and the glue to it).
- server/: uvicorn, the service's state file, `amlemu env`'s variables (__init__.py) and its CA
  and certificates (tls.py).
- mlflowmount.py: MLflow's own tracking server under /mlflow, with the run-token policy.

A new route: a handler `def name(call: Call) -> Reply` in the protocol module of its resource,
one line in routes.py's ROUTES (method, path, handler, auth scope), and what it needs of the
workspace as a State method (declared in state/__init__.py, implemented in state/emulator.py and by
the tests' double, pytest_amlemu.amlservice). The studio page is not part of the service:
emulator/studio/ (`amlemu serve` mounts it; `amlemu ui` serves it alone).
"""
