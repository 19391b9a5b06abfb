"""Work receipts (`ctx.step`): their keys, the gateway's store and the app-code views."""
