"""Admission: a run, its first ledger event and its outbox row, committed together."""
