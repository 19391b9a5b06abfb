"""Parsers of everything from outside: scalar arguments, durations, listing filters and
sandbox documents."""
