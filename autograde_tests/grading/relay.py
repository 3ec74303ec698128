"""Relays between a graded kernel and the grader: whole messages bounded, in processes of their own.

zmq's ``MAXMSGSIZE`` bounds a frame, not a message. A kernel can split one message into any number of
frames each under the limit, and zmq holds them all in the receiving process before it hands over the
first: a grader that received from the kernel itself could not count a message before it held it. So
the grader never does. For each socket it talks through (shell, iopub, control, stdin) a relay process receives
from the kernel, counts each whole message, and passes on only those of at most ``--message-bytes``;
what the grader receives from it zmq bounds again, in messages and frames (``bounded``).

A relay's own memory is capped by ``RLIMIT_AS``: a message too large for it fails an allocation there,
and the relay ends, never the grader. A relay also ends when it counts a message over the limit, when
zmq cuts its connection to the kernel (a frame over ``MAXMSGSIZE``) or the kernel goes, and when the
grader does (its stdin closes). Either way the grader sees its own connection to that relay cut, as it
saw zmq cut one before (``channels.BoundedClient.lost``): the cell loses its last messages, and the
grader starts the kernel's relays again before the next cell (``Relays.renew``).

Why a process capped by ``RLIMIT_AS`` and not a cgroup: it bounds the relay wherever the grader runs,
cgroups or not, by the address space, which no resident memory can exceed; a relay is one small Python
with zmq (about 40 MiB of it, one malloc arena), so the cap is the room for the messages it may hold.
Why not a cgroup for the worker itself: the worker holds torch and nbgrader, and an over-size message
would kill it, ending every submission it had in hand. The control socket's messages from the kernel are
read and dropped: the grader only ever sends on it (an interrupt).

A relay passes on a message only when the grader's side takes it (``XPUB_NODROP``,
``ROUTER_MANDATORY``): until then it reads no more from the kernel, which then waits, or drops, in its
own memory, as it did when the grader received from it directly.
"""

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

import zmq

from . import limits

CHANNELS = ("shell", "iopub", "control", "stdin")
RETRY_MS = 10  # how soon a relay tries again to pass on a message the grader's side could not take yet


def bounded(context: zmq.Context, frame_bytes: int) -> zmq.Context:
    """``context``, whose sockets (made from now on) zmq bounds: frames of at most ``frame_bytes``
    (a larger one cuts the connection, unread) and ``limits.WAITING_MESSAGES`` messages."""
    context.setsockopt(zmq.MAXMSGSIZE, frame_bytes)
    context.setsockopt(zmq.RCVHWM, limits.WAITING_MESSAGES)
    return context


def url(prefix: str, port: int) -> str:
    """The address of a socket at ``prefix`` (a path: the transport is ipc), as jupyter_client names it."""
    return f"ipc://{prefix}-{port}"


class Relays:
    """The relays of one kernel, whose sockets are at ``kernel`` and whose relays' sockets at ``prefix``."""

    def __init__(self, kernel: str, prefix: str, ports: dict[str, int], message_bytes: int):
        self.kernel, self.prefix, self.ports, self.message_bytes = kernel, prefix, ports, message_bytes
        self.processes: list[subprocess.Popen] = []

    def renew(self) -> bool:
        """End the relays that run and start new ones; once each listens for the grader, True (False if one
        could not start)."""
        self.close()
        # It imports this package from where the grader did, whichever clone that is.
        env = os.environ | {"MALLOC_ARENA_MAX": "1",
                            "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        identity = os.urandom(8).hex()
        for channel in CHANNELS:
            port = self.ports[channel]
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", __name__, channel, url(self.kernel, port), url(self.prefix, port),
                 "--message-bytes", str(self.message_bytes), "--identity", identity],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))
        return all([process.stdout.readline() == b"listening\n" for process in self.processes])

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
            process.stdin.close()
            process.stdout.close()
        self.processes.clear()

    def ended(self) -> bool:
        """Whether a relay has ended (the grader's connection to it is cut)."""
        return any(process.poll() is not None for process in self.processes)


def relay(channel: str, kernel: str, grader: str, message_bytes: int, identity: str) -> None:
    """Pass ``channel``'s messages between the kernel's socket at ``kernel`` and the grader's at ``grader``
    until a message from the kernel is over ``message_bytes``, a connection to the kernel is cut, or stdin
    closes. The relays of one kernel meet it under one ``identity``: the kernel addresses an input request
    on stdin to whoever sent the execute request on shell."""
    context = zmq.Context()
    if channel == "iopub":
        backend, frontend = context.socket(zmq.SUB), context.socket(zmq.XPUB)
        backend.subscribe(b"")
        frontend.setsockopt(zmq.XPUB_NODROP, 1)
    else:
        backend, frontend = context.socket(zmq.DEALER), context.socket(zmq.ROUTER)
        backend.setsockopt(zmq.IDENTITY, identity.encode())
        frontend.setsockopt(zmq.ROUTER_MANDATORY, 1)
    backend.setsockopt(zmq.MAXMSGSIZE, message_bytes)
    backend.setsockopt(zmq.RCVHWM, 1)
    frontend.setsockopt(zmq.SNDHWM, 1)
    cut = backend.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    backend.connect(kernel)
    frontend.bind(grader)
    print("listening", flush=True)
    pending = None  # a message from the kernel that the grader's side has not taken yet
    stdin = sys.stdin.fileno()  # zmq's poller names a file by its descriptor, whatever was registered
    while True:
        poller = zmq.Poller()
        for socket in (stdin, cut, frontend):
            poller.register(socket, zmq.POLLIN)
        if pending is None:
            poller.register(backend, zmq.POLLIN)
        events = dict(poller.poll(RETRY_MS if pending is not None else None))
        # A pipe whose writer is gone polls as an error (POLLHUP), not as input: any event, then read.
        if events.get(stdin) and not os.read(stdin, 1):
            return
        if events.get(cut):
            return
        if events.get(frontend):
            frames = frontend.recv_multipart(copy=False)
            if channel != "iopub":  # iopub's are the grader's subscriptions, for this relay alone
                backend.send_multipart(frames, copy=False)
        if events.get(backend):
            frames = backend.recv_multipart(copy=False)
            if sum(len(frame) for frame in frames) > message_bytes:
                return
            if channel != "control":
                pending = frames
        if pending is not None:
            try:
                frontend.send_multipart(pending, copy=False, flags=zmq.NOBLOCK)
                pending = None
            except zmq.Again:  # the grader's side is full: try again soon, reading nothing meanwhile
                pass
            except zmq.ZMQError:  # addressed to no one the grader has connected (EHOSTUNREACH)
                pending = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("channel", choices=CHANNELS)
    parser.add_argument("kernel", help="the kernel's socket")
    parser.add_argument("grader", help="where the grader connects")
    parser.add_argument("--message-bytes", type=int, required=True)
    parser.add_argument("--identity", required=True, help="this kernel's relays' identity on its sockets")
    args = parser.parse_args()
    cap = limits.RELAY_BASE_BYTES + limits.RELAY_HELD_MESSAGES * args.message_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # zmq aborts when an allocation fails: no core dump
    relay(args.channel, args.kernel, args.grader, args.message_bytes, args.identity)
    os._exit(0)  # at once: nothing it still holds is worth waiting for zmq to send


if __name__ == "__main__":
    main()
