"""Runtime sheets (docs/design.md): versioned tables of rows a play fills under a write intent.

`store` is the SQL the gateway's sheet actions run under the launch fence; `view` is
what app code and the CLI read. The play's side is tasks/execution/runner_sheets.py.
"""
