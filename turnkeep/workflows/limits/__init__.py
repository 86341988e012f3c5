"""Limits shared by a fleet: the ledger of one limit and its limiter workflow, and the turn's side."""
