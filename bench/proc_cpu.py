"""CPU time of processes on this machine, from /proc: a bench's servers (Daphne, PostgreSQL,
Redis) run here, so what each part used is read rather than guessed from wall time."""

import os
from pathlib import Path


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU time of a process (and of its reaped children), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu(postmaster: int) -> float:
    """The postmaster, its exited backends (reaped: in its children's time) and live ones."""
    total = cpu_seconds(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
            if parent == postmaster:
                total += cpu_seconds(int(entry.name))
    return total
