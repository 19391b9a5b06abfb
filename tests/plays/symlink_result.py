import os


def run(ctx, input):
    # A hostile play points its result file at a worker file and exits before the runner
    # can write its own result.
    os.symlink("/etc/passwd", "result.json")
    os._exit(0)
