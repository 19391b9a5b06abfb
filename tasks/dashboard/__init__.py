"""The operators' dashboard (`playrun dashboard`): server-rendered, read-only but for run again."""
