"""Real processes: watch, `agent-mail serve` (tests/functional/test_server*.py), PostgreSQL restarted under a
server, replicas behind proxies, two hosts in network namespaces, the deployment page, the dashboard in a pilot
and in a browser."""
