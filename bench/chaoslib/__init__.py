"""The chaos suite (bench/chaos.py): fault kinds, the stack and load, the invariants."""
