def run(ctx, input)
    return 1
