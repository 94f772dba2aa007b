#!/usr/bin/env python3
"""A plain TCP socket stream, one direction, one connection: the reference that
scripts/peers/compare_tcp.sh measures beside iperf3 (and instead of it where iperf3 is missing).

  python tcp_stream.py server --bind 10.0.0.2 --port 5201          # on the receiving side
  python tcp_stream.py client --connect 10.0.0.2 --port 5201 --seconds 3

The client sends BLOCK-byte buffers (sendall) for SECONDS, then half-closes; the server
counts what it received with recv_into and answers with that count once the stream has
ended, so the rate (printed by the client as one JSON line: bytes, seconds, gbps = GB/s,
decimal) covers bytes that arrived, timed from the first send to the server's answer. The
server accepts one connection and exits. Socket buffers are the kernel's defaults (autotuned),
as iperf3 leaves them.
"""
import argparse
import json
import socket
import struct
import sys
import time


def server(a):
    with socket.create_server((a.bind, a.port)) as ls:
        ls.settimeout(a.timeout)
        conn, _ = ls.accept()
    with conn:
        conn.settimeout(a.timeout)
        buf = bytearray(a.block)
        view = memoryview(buf)
        total = 0
        t0 = None
        while True:
            n = conn.recv_into(view)
            if n == 0:
                break
            if t0 is None:
                t0 = time.perf_counter()
            total += n
        seconds = time.perf_counter() - t0 if t0 is not None else 0.0
        conn.sendall(struct.pack("!Q", total))
    print(json.dumps({"tool": "tcp_stream", "side": "server", "bytes": total,
                      "seconds": round(seconds, 6)}), flush=True)
    return 0


def client(a):
    deadline = time.time() + a.timeout
    while True:  # the server may still be starting
        try:
            s = socket.create_connection((a.connect, a.port), timeout=a.timeout)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    with s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = memoryview(bytearray(a.block))
        sent = 0
        t0 = time.perf_counter()
        end = t0 + a.seconds
        while time.perf_counter() < end:
            s.sendall(data)
            sent += len(data)
        s.shutdown(socket.SHUT_WR)
        ack = b""
        while len(ack) < 8:
            chunk = s.recv(8 - len(ack))
            if not chunk:
                break
            ack += chunk
        seconds = time.perf_counter() - t0
    if len(ack) != 8:
        print(json.dumps({"tool": "tcp_stream", "error": "the server did not answer"}), flush=True)
        return 1
    received = struct.unpack("!Q", ack)[0]
    print(json.dumps({"tool": "tcp_stream", "bytes": received, "sent": sent, "block": a.block,
                      "seconds": round(seconds, 6), "gbps": received / seconds / 1e9}), flush=True)
    return 0 if received == sent else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="side", required=True)
    srv = sub.add_parser("server")
    srv.add_argument("--bind", required=True)
    cli = sub.add_parser("client")
    cli.add_argument("--connect", required=True)
    cli.add_argument("--seconds", type=float, default=3.0)
    for p in (srv, cli):
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--block", type=int, default=1 << 20, help="bytes per send / receive call")
        p.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    return server(a) if a.side == "server" else client(a)


if __name__ == "__main__":
    sys.exit(main())
