"""The optional integrations, tested with the real packages (``nox -s extras``)."""
