"""The floor under L1 on this machine: 10 MiB sent over one loopback TCP
connection (sendall, TCP_NODELAY; the reader in a thread, 1 MiB reads),
40 times; prints the p50 and the fastest. No HTTP, no daemon.

    python3 docs/bench/loopback_floor.py
"""
import socket
import threading
import time

N = 10 * 1024 * 1024
DATA = b"x" * N
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
received = [0]
target = [0]
done = threading.Event()


def sink():
    conn, _ = srv.accept()
    buf = memoryview(bytearray(1 << 20))
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        received[0] += n
        if received[0] >= target[0]:
            done.set()


threading.Thread(target=sink, daemon=True).start()
s = socket.create_connection(srv.getsockname())
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(40):
    done.clear()
    target[0] += N
    t = time.perf_counter()
    s.sendall(DATA)
    done.wait()
    times.append(time.perf_counter() - t)
times.sort()
print(f"10 MiB over loopback TCP: p50 {times[len(times) // 2] * 1000:.2f} ms, "
      f"fastest {times[0] * 1000:.2f} ms")
