"""The attestation verifier: a node's TPM quote and event log, its devices' SPDM reports.

It judges evidence and keeps the per-node state that judging needs (EK bindings, counters);
it knows nothing of sessions or commands. The session server (agent/gateway/server.py) calls
it through join.py; nothing here imports the rest of agent/gateway/.
"""
