"""What goes over the wire: Azure ML's routes, their requests and replies (service/__init__.py has the map)."""
