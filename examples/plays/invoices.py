"""Price invoices in euros: one exchange-rate lookup kept as a work receipt (ctx.step), and
one runtime-sheet row per invoice (ctx.sheet().map), written back as each is priced.

input: {"month": "2026-12", "invoices": [{"id": "A-1", "amount": 120.0, "currency": "USD"}, ...]}
"""

RATES = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.06}


def fetch_rates(month):
    # Stands in for a paid API call: ctx.step stores its answer, and every later run of
    # this play in the same org gets the stored answer without calling it again.
    return {"month": month, "to_eur": RATES}


def run(ctx, input):
    month = input["month"]
    rates = ctx.step(f"rates:{month}", lambda: fetch_rates(month))

    def price(invoice):
        # A row whose function raises is stored "failed" with the error; the others go on.
        rate = rates["to_eur"].get(invoice["currency"])
        if rate is None:
            raise ValueError(f"no rate for {invoice['currency']}")
        return {"eur": round(invoice["amount"] * rate, 2)}

    priced = ctx.sheet("invoices").map(input["invoices"], price, key="id")
    ctx.log("priced", rows=len(priced), failed=len(priced.errors))
    return {
        "month": month,
        "total_eur": round(sum(row["eur"] for row in priced if row is not None), 2),
        "failed": sorted(priced.errors),
    }
