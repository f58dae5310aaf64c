"""Starting the process: the preflight checks and the uvicorn/granian launchers (above gateway.app, which they serve)."""
