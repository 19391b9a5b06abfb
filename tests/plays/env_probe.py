import os


def run(ctx, input):
    return {k: v for k, v in os.environ.items()}
