def run(ctx, input):
    ctx.log("about to fail")
    raise ValueError("the customer code broke")
