"""Judgements on what the hardware reports: GPU health, Xid events, the gate."""
