"""A hostile play: tries one way out of its sandbox (input["probe"]) and reports what it got.

Each probe returns what a user would see it achieve; the strict-isolation tests assert that
nothing outside the sandbox was reachable. Standard library only.
"""

import ctypes
import errno
import os
import socket
import subprocess
import time


def _try(fn):
    try:
        value = fn()
    except OSError as exc:  # every refusal the kernel can give
        return f"refused: {errno.errorcode.get(exc.errno, exc.errno)}"
    except Exception as exc:  # noqa: BLE001 - report, never crash the probe
        return f"refused: {type(exc).__name__}: {exc}"
    return f"ok: {value!r}"[:300]


def _read(path):
    with open(path, "rb") as fh:
        return len(fh.read())


def _write(path):
    with open(path, "wb") as fh:
        fh.write(b"escaped")
    return path


def files(input):
    out = {"read": {}, "write": {}, "list": {}}
    for path in input.get("read", []):
        out["read"][path] = _try(lambda p=path: _read(p))
    for path in input.get("write", []):
        out["write"][path] = _try(lambda p=path: _write(p))
    for path in input.get("list", []):
        out["list"][path] = _try(lambda p=path: sorted(os.listdir(p))[:20])
    out["root"] = sorted(os.listdir("/"))
    return out


def environ(input):
    seen = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            for what in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{name}/{what}", "rb") as fh:
                        seen[f"{name}/{what}"] = fh.read().decode(errors="replace")
                except OSError as exc:
                    seen[f"{name}/{what}"] = f"refused: {errno.errorcode.get(exc.errno)}"
    return {"pids": sorted(int(n) for n in os.listdir("/proc") if n.isdigit()), "seen": seen}


def _connect(host, port):
    with socket.create_connection((host, port), timeout=2):
        return "connected"


def network(input):
    out = {"interfaces": [name for _, name in socket.if_nameindex()]}
    if out["interfaces"] != ["lo"]:
        # Never send anything off this machine: a visible network is already a failure.
        return out
    for port in input["ports"]:
        out[f"127.0.0.1:{port}"] = _try(lambda p=port: _connect("127.0.0.1", p))
    out["resolve"] = _try(lambda: socket.getaddrinfo("example.com", 443))
    out["route"] = _try(lambda: open("/proc/net/route").read().splitlines()[1:])
    return out


def gateway(input):
    path = "/run/playrun/gateway.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        answer = sock.recv(100)
    return {"answer": answer.decode().split("\r\n")[0],
            "unlink": _try(lambda: os.unlink(path))}


def kernel(input):
    libc = ctypes.CDLL(None, use_errno=True)

    def call(fn, *args):
        if fn(*args) != 0:
            raise OSError(ctypes.get_errno(), "")
        return "done"

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    worker = int(input["worker_pid"])
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)

    def syscall(nr):
        if libc.syscall(nr, 0, 0, 0, 0, 0) < 0:
            raise OSError(ctypes.get_errno(), "")
        return "done"

    try:
        own_child = _try(lambda: call(libc.ptrace, 16, child, None, None))
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    return {
        "ptrace its own child": own_child,
        "io_uring_setup": _try(lambda: syscall(425)),
        "bpf": _try(lambda: syscall(321)),
        "userfaultfd": _try(lambda: syscall(323)),
        "keyctl": _try(lambda: syscall(250)),
        "perf_event_open": _try(lambda: syscall(298)),
        "umount /proc": _try(lambda: call(libc.umount2, b"/proc", 2)),
        "mount tmpfs": _try(lambda: call(libc.mount, b"none", b"/sandbox", b"tmpfs", 0, None)),
        "new user namespace": _try(lambda: call(libc.unshare, 0x10000000)),
        "set the clock": _try(lambda: call(libc.clock_settime, 0,
                                           ctypes.byref(Timespec(0, 0)))),
        "date -s": subprocess.run(["date", "-s", "@0"], capture_output=True).returncode,
        "kill the worker": _try(lambda: os.kill(worker, 9)),
        "ptrace the worker": _try(lambda: call(libc.ptrace, 16, worker, None, None)),
        "sethostname": _try(lambda: call(libc.sethostname, b"owned", 5)),
        "chroot": _try(lambda: call(libc.chroot, b"/tmp")),
    }


def forkbomb(input):
    forked, error = 0, None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            pid = os.fork()
        except OSError as exc:
            error = errno.errorcode.get(exc.errno, str(exc.errno))
            break
        if pid == 0:  # every child forks too, then waits to be killed
            try:
                while True:
                    os.fork()
            except OSError:
                pass
            time.sleep(60)
            os._exit(0)
        forked += 1
    return {"forked": forked, "error": error}


def memory(input):
    return len(bytearray(8 * 1024**3))


def big_file(input):
    with open("big", "wb") as fh:
        for _ in range(input.get("mb", 1024)):
            fh.write(b"x" * 1024 * 1024)
    return "wrote it all"


def many_files(input):
    chunk = b"x" * 1024 * 1024
    for i in range(input.get("files", 1000)):
        with open(f"fill-{i}", "wb") as fh:
            for _ in range(input.get("mb_each", 4)):
                fh.write(chunk)
    return "wrote it all"


def daemon(input):
    tag = input["tag"]
    subprocess.Popen(["sh", "-c", f"sleep {tag} </dev/null >/dev/null 2>&1 &"],
                     start_new_session=True).wait()
    return "left a daemon"


PROBES = {f.__name__: f for f in (files, environ, network, gateway, kernel, forkbomb,
                                  memory, big_file, many_files, daemon)}


def run(ctx, input):
    ctx.log("probing", probe=input["probe"])
    return PROBES[input["probe"]](input)
