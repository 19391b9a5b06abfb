"""A hostile tenant: it takes its runner's token from memory and abuses the gateway it must
reach (tests/e2e/test_noisy_neighbour.py). input["mode"] picks the abuse, input["seconds"]
how long; the output counts the HTTP statuses it got back.

"probe" is the good neighbour's side: it times heartbeats with its own token.
"""

import collections
import contextlib
import gc
import json
import threading
import time


def _uplink():
    for obj in gc.get_objects():
        if type(obj).__name__ == "Uplink":
            return obj
    raise RuntimeError("no uplink: run this play under a gateway")


def _post(up, body, action=""):
    """One request on a fresh connection; its HTTP status (0 when the connection failed)."""
    try:
        conn = up.gateway._connect()
    except OSError:
        return 0
    try:
        status, _raw, _closing = conn.post(up.gateway.prefix + "/v1/runtime", body, up.token,
                                           action)
        return status
    except Exception:
        return 0
    finally:
        conn.close()


def _for(seconds, threads, work):
    counts = collections.Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop():
        while time.monotonic() < deadline:
            status = work()
            with lock:
                counts[str(status)] += 1

    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return dict(counts)


def _hold_connections(up, seconds, n):
    """Many connections, each sending its headers a byte at a time (slowloris)."""
    socks = []
    for _ in range(n):
        try:
            socks.append(up.gateway._connect())
        except OSError:
            break
    head = b"POST /v1/runtime HTTP/1.1\r\nHost: gateway\r\nContent-Length: 100\r\n"
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline and i < len(head):
        for conn in socks:
            with contextlib.suppress(OSError):
                conn.sock.sendall(head[i:i + 1])
        i += 1
        time.sleep(seconds / len(head))
    for conn in socks:
        conn.close()
    return {"held": len(socks)}


def run(ctx, input):
    mode, seconds = input["mode"], float(input.get("seconds", 5))
    up = _uplink()
    if mode not in ("probe", "token"):
        ctx.log("abusing", mode=mode)
    if mode == "huge":  # 2 million tiny values, just under the body limit
        body = b"[" + b"0," * 1_999_999 + b"0]"
        return _for(seconds, 4, lambda: _post(up, body))
    if mode == "flood":  # batches of 10,000 actions
        body = json.dumps({"actions": [{"action": "heartbeat"}] * 10_000}).encode()
        return _for(seconds, 4, lambda: _post(up, body))
    if mode == "steps":  # claims of one completed key, as fast as the gateway answers
        ctx.step("the-key", lambda: {"done": True})
        done = [0]

        def claim():
            ctx.step("the-key", lambda: {"done": False})
            done[0] += 1
            return 200

        counts = _for(seconds, 4, claim)
        return dict(counts, claims=done[0])
    if mode == "connections":
        return _hold_connections(up, seconds, int(input.get("connections", 200)))
    if mode == "token":  # hands its token out (an accomplice replays it after the run)
        return {"token": up.token, "prefix": up.gateway.prefix}
    if mode == "probe":  # the good neighbour: heartbeat round trips on its own connections
        threads, pause = int(input.get("threads", 1)), float(input.get("pause", 0.05))
        times = []
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def beats():
            beat = json.dumps({"action": "heartbeat"}).encode()
            conn = up.gateway._connect()
            try:
                while time.monotonic() < deadline:
                    t0 = time.perf_counter()
                    status, _raw, closing = conn.post(up.gateway.prefix + "/v1/runtime", beat,
                                                      up.token, "heartbeat")
                    took = round(time.perf_counter() - t0, 4) if status == 200 else -status
                    with lock:
                        times.append(took)
                    if closing:
                        conn.close()
                        conn = up.gateway._connect()
                    time.sleep(pause)
            finally:
                conn.close()

        pool = [threading.Thread(target=beats) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return {"beats": times}
    raise ValueError(f"unknown mode {mode!r}")
