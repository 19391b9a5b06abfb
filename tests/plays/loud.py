def run(ctx, input):
    line = "x" * 1023
    for _ in range(20 * 1024):
        print(line)
    return {"printed_mb": 20}
