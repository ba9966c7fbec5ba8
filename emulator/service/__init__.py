"""`amlemu serve`: Azure ML's own REST API on this machine, backed by the emulator, so unmodified
azure-ai-ml code runs on emulated nodes.

routes.py is the protocol (paths, REST shapes, auth) on Starlette, with calls.py (what a handler
is given and returns) and datablobs.py (the datastores' blob endpoint: jobs.download, local
inputs); state.py the small interface the routes call; emustate.py (+ emujobs.py, emublobs.py)
that interface over the real emulator; tls.py the CA kept in the home; auth.py the tokens and
signed URLs; server.py uvicorn, the state file and `amlemu env`'s variables.
"""
