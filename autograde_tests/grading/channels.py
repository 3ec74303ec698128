"""The grader's side of a graded kernel's connection: channels that bound what they read, and their client.

The grader receives from the kernel's relays, never from the kernel (``relay``), on sockets zmq bounds
(``relay.bounded``: frames of at most ``limits.FRAME_BYTES``, a few messages waiting). On them:

- a message's content is parsed only when it fits what the grader would keep of it (``BoundedChannel``):
  headers up to ``limits.HEADER_BYTES``, an execute reply up to ``limits.SHELL_BYTES``, a call on what
  the grader lent (stdin) up to ``limits.REPLY_BYTES``, an output what the cap has left (``execute``);
- the client reads only the sockets the grader reads, and says when a connection to a relay was cut
  (``BoundedClient.lost``).
"""

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type

from ..remote.agent import REQUEST
from . import limits, relay


class BoundedChannel(AsyncZMQSocketChannel):
    """A channel that parses a message's content only when it is at most ``limit()`` bytes.

    Every message it returns carries ``bytes``, the size of its content and buffers as they arrived; a
    larger one comes back ``oversized``; one that cannot be read (headers over ``limits.HEADER_BYTES``, not
    JSON, a bad signature) comes back as an ``unreadable`` message of no cell's, which nbclient ignores.
    """

    limit = staticmethod(lambda: limits.HEADER_BYTES)

    async def _recv(self, **kwargs) -> dict:
        frames = await self.socket.recv_multipart(**kwargs)
        try:
            _, parts = self.session.feed_identities(frames)
            size = sum(len(part) for part in parts[4:])
            if len(parts) < 5 or any(len(part) > limits.HEADER_BYTES for part in parts[1:4]):
                return _unreadable(size)
            readable = size <= self.limit()
            message = self.session.deserialize(parts, content=readable)
            if not (isinstance(message["parent_header"], dict) and isinstance(message["msg_type"], str)
                    and (not readable or isinstance(message["content"], dict))):
                return _unreadable(size)
        except Exception:  # whatever the kernel sent, it is not a message the grader reads
            return _unreadable(sum(len(frame) for frame in frames))
        message["bytes"] = size
        return message if readable else self.oversized(message)

    def oversized(self, message: dict) -> dict:
        return message | {"content": {}, "buffers": [], "oversized": True}


class BoundedShellChannel(BoundedChannel):
    """The shell channel: an execute reply over ``limits.SHELL_BYTES`` becomes an error that says so.

    An execute request carries in its metadata the grader's request that ``carry()`` hands over, if any
    (see ``agent.serve``), and then runs silent: the kernel echoes no code and runs none of the learner's
    post-execute hooks (``%matplotlib inline`` flushes figures in one) around each of the grader's requests.
    """

    limit = staticmethod(lambda: limits.SHELL_BYTES)
    carry = staticmethod(lambda: None)

    def send(self, msg: dict) -> None:
        request = self.carry() if msg["msg_type"] == "execute_request" else None
        if request is not None:  # stdin: the learner's code calls what the grader lent it (``lent``)
            msg["metadata"][REQUEST] = request
            msg["content"] |= {"silent": True, "allow_stdin": True}
        super().send(msg)

    def oversized(self, message: dict) -> dict:
        evalue = f"the kernel's reply was {message['bytes']} bytes, over the grader's {limits.SHELL_BYTES}"
        error = {"status": "error", "ename": "ReplyTooLarge", "traceback": [], "evalue": evalue}
        return message | {"content": error, "buffers": []}


class BoundedStdinChannel(BoundedChannel):
    """The stdin channel, on which the kernel calls what the grader lent (one call's text, as a reply's)."""

    limit = staticmethod(lambda: limits.REPLY_BYTES)


class BoundedClient(AsyncKernelClient):
    """The grader's client of a graded kernel: bounded channels on sockets zmq bounds, and only those the
    grader reads (a socket nobody reads, control, the kernel could fill at will)."""

    shell_channel_class = Type(BoundedShellChannel)
    iopub_channel_class = Type(BoundedChannel)
    stdin_channel_class = Type(BoundedStdinChannel)

    def _context_default(self):
        return relay.bounded(super()._context_default(), limits.FRAME_BYTES)

    def start_channels(self, shell=True, iopub=True, stdin=True, hb=True, control=True) -> None:
        # nbclient asks the kernel manager, not the heartbeat, whether the kernel lives.
        super().start_channels(shell=shell, iopub=iopub, stdin=stdin, hb=False, control=False)
        self.monitors = [channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                         for channel in (self.shell_channel, self.iopub_channel, self.stdin_channel)]

    def stop_channels(self) -> None:
        super().stop_channels()
        for monitor in getattr(self, "monitors", []):
            monitor.close(linger=0)
        self.monitors = []

    def lost(self) -> bool:
        """Whether a connection to the kernel's relays was cut (a relay ended: see ``relay``)."""
        return any(monitor.get(zmq.EVENTS) & zmq.POLLIN for monitor in self.monitors)


def _unreadable(size: int) -> dict:
    return {"header": {}, "msg_id": "", "msg_type": "unreadable", "parent_header": {}, "metadata": {},
            "content": {}, "buffers": [], "bytes": size}
