def main(ctx, input):
    return 1
