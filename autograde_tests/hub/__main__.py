"""``python -m autograde_tests.hub`` (``make hub``): the course on a local JupyterHub until Ctrl-C."""

import argparse
import signal
import sys
from pathlib import Path

from .accounts import HubError
from .local_hub import REPO, Hub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde_tests.hub", description=__doc__)
    parser.add_argument("--proxy", type=Path, required=True, help="configurable-http-proxy's program")
    parser.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1 (default: 8000)")
    parser.add_argument("--instructor", default="instructor", help="the instructor's account name")
    parser.add_argument("--learners", default="learner1,learner2", help="learners' account names, comma-separated")
    args = parser.parse_args(argv)
    # Ctrl-C and a plain kill both end the hub the same way, through Hub's exit (SIGINT too: a shell that
    # starts the hub in the background would otherwise have it ignored).
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.default_int_handler)
    hub = Hub(args.proxy, args.instructor, tuple(n for n in args.learners.split(",") if n), args.port)
    try:
        with hub:
            print(f"The course's JupyterHub is at {hub.url}  (Ctrl-C stops it and removes its accounts)")
            print(f"  instructor  {hub.instructor:12}  password {hub.passwords[hub.instructor]}"
                  f"   course folder {hub.course}")
            for name in hub.learners:
                print(f"  learner     {name:12}  password {hub.passwords[name]}")
            print(f"  exchange    {hub.exchange}")
            print(f"  grade as the instructor, in a terminal of the hub: make -C {REPO} grade "
                  f'ARGS="--course $HOME"')
            sys.stdout.flush()
            signal.pause()
    except KeyboardInterrupt:
        print("stopped; the hub's accounts and folders are removed")
    except HubError as error:
        print(f"make hub: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
