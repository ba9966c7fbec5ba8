"""Pipeline jobs and components: Azure ML's graphs of steps, read, planned and run locally."""
