"""The floor for a 10 MiB List on loopback: one socket pair moving 10 MiB per
request, 30 times; prints the median and the minimum (docs/BENCHMARKS.md,
session 5). Run: python3 docs/bench/loopback_tcp.py"""
import socket, threading, time
N=10*1024*1024
data=b'x'*N
srv=socket.socket(); srv.bind(('127.0.0.1',0)); srv.listen(1)
port=srv.getsockname()[1]
def serve():
    c,_=srv.accept()
    while True:
        r=c.recv(10)
        if not r: break
        c.sendall(data)
threading.Thread(target=serve,daemon=True).start()
cl=socket.socket(); cl.connect(('127.0.0.1',port))
buf=bytearray(1<<20)
ts=[]
for i in range(30):
    t=time.perf_counter()
    cl.send(b'g')
    got=0
    while got<N:
        got+=cl.recv_into(buf)
    ts.append(time.perf_counter()-t)
ts.sort(); print("p50 ms", ts[15]*1000, "min", ts[0]*1000)
