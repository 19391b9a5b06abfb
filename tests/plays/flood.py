def run(ctx, input):
    for i in range(int(input["lines"])):
        ctx.log("line", i=i)
    return {"logged": int(input["lines"])}
