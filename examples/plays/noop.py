def run(ctx, input):
    return None
