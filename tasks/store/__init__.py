"""The database and what every layer writes through it: engines, the fence, the ledger,
run listings."""
