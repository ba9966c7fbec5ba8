"""The studio page: a live view of the workspace's jobs (overview, each job's status, chart, logs and
files), behind its one-time-link login. Served by `amlemu serve` beside the Azure ML API and alone
by `amlemu ui`; it reads the home's state and run folders and needs nothing of the service.

app.py: the Starlette app and its routes; data.py: what the pages show, read from the store and
run folders; pages.py: the HTML; gate.py: the login (one-time links, session cookies, the Host
check); uistore.py: the MLflow store `amlemu ui --mlflow` serves; studio.js/.css: the page's script.
"""
