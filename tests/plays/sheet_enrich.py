"""A sheet play: enrich input["rows"] (objects keyed by "domain") into the sheet.

input: rows; table (default "companies"); hold (a domain whose row waits until a newer
write version of the sheet has written it, at most hold_s seconds); fail rows carry
"fail": true and raise.
"""

import time


def run(ctx, input):
    sheet = ctx.sheet(input.get("table", "companies"))
    hold = input.get("hold")

    def wait_for_newer(domain):
        deadline = time.monotonic() + input.get("hold_s", 60)
        ctx.log("holding", domain=domain)
        while time.monotonic() < deadline:
            rows = sheet.rows(keys=[domain])
            if rows and rows[0]["write_version"] > sheet.write_version \
                    and rows[0]["status"] == "done":
                return
            time.sleep(0.1)

    def enrich(row):
        if row["domain"] == hold:
            wait_for_newer(row["domain"])
        if row.get("fail"):
            raise ValueError(f"cannot enrich {row['domain']}")
        return {"domain": row["domain"], "letters": len(row["domain"]), "by": ctx.run_id}

    done = sheet.map(input["rows"], enrich, key="domain")
    return {"enriched": len(done), "failed": len(done.errors),
            "write_version": sheet.write_version}
