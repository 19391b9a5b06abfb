def run(ctx, input):
    ctx.log("nul \x00 here", odd="\ud800", fine=1)
    return {"text": "a\x00b", "key\x00": ["\udfff"]}
