"""The `playrun` command line: runs, the dev and demo stacks, operator commands."""
