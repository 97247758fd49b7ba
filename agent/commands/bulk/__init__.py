"""The bulk lane's kinds (logs.collect, instance.snapshot) and what they share (transfer.py:
confined paths, bounded bandwidth, the upload)."""
