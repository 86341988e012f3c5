"""Limits shared by a fleet: the ledger of a limit, its limiter workflow, the turn's side."""
