def run(ctx, input):
    return {"a set": {1, 2, 3}}
