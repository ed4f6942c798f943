"""A loopback-only network namespace for tests that start Ray (``unshare -rn``: a user and a
network namespace whose only interface is ``lo``), where Ray listens on 127.0.0.1 only and
reaches nothing else."""

from __future__ import annotations

import subprocess

__all__ = ["ENTER", "INSIDE", "loopback_namespace"]

#: Set in the environment of a process running inside the namespace.
INSIDE = "CONCURRENT_LOADER_LOOPBACK_NAMESPACE"

#: ``sh -c`` script: bring ``lo`` up, then run the command given after it.
ENTER = 'ip link set lo up && exec "$0" "$@"'


def loopback_namespace() -> str | None:
    """Why a loopback-only namespace cannot be made here (None: it can)."""
    try:
        probe = subprocess.run(
            ["unshare", "-rn", "sh", "-c", "ip link set lo up"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -rn could not run ({exc})"
    if probe.returncode != 0:
        return f"unshare -rn failed: {probe.stderr.strip() or probe.returncode}"
    return None
