"""Torch-free arithmetic of time and quota: the plan, its tripwires, the session ledger."""
