"""Every limit faultline enforces on what it reads, stated once (docs/limits.md explains each to users).

The code that enforces a limit imports it from here; command-line flags and the service's Settings
default to these values. Past a limit faultline keeps what it read and says where it stopped (a
coverage entry, or a 4xx from the service): never a crash, never a 5xx, never a silent loss.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# ---------------------------------------------------------------- reading log text (CLI, flows, service)
# A line longer than this is cut (its head kept, with a marker saying how many bytes went): a log line
# that long is a dump (a tensor, base64), and one endless "line" must not become one huge string.
# `\r` ends a record as `\n` does: a tqdm progress bar rewrites one terminal line with `\r` for hours,
# and what a crash prints after it must not vanish inside that one physical line.
MAX_LINE_BYTES = 64 * KIB
# Bytes read from a file at a time: memory per file stays near this, whatever the file's size.
BLOCK_BYTES = 16 * MIB


@dataclass(frozen=True)
class ReadLimits:
    """How much text one job's files may yield. `file_bytes` bounds what one compressed file inflates
    to (a 65 KB .gz can hold 64 MiB of newlines, a 1 MB one gigabytes); `job_bytes` and `job_lines`
    bound all files of a job together (plain files count too), so time and memory follow what an
    operator can have meant to send, not what an archive claims."""

    file_bytes: int  # decompressed bytes of one compressed file
    job_bytes: int  # text bytes of all files of a job (after decompression)
    job_lines: int  # lines of all files of a job


# `faultline diagnose`, `faultline eval` and the flows' file sources: generous, a 2 GB log of a big job
# (20 M lines) and a 64-node job of 500 MB per node fit; a bomb stops after minutes, not hours.
CLI_READ = ReadLimits(file_bytes=8 * GIB, job_bytes=64 * GIB, job_lines=400_000_000)

# One `POST /v1/diagnose` (defaults of `faultline serve --max-decompressed-mb / --max-lines`): a worker
# is one of two, so one request may cost seconds, not minutes: 4x the default body limit of text, and
# 20 M lines (~10 s of one worker at the measured 0.45 s per million tiny lines).
SERVICE_DECOMPRESSED_MB = 2048
SERVICE_MAX_LINES = 20_000_000

# ---------------------------------------------------------------- numbers a log line prints
# Ranks a job can have. A printed world size, rank or count is a claim of the line, never a size to
# allocate by: `world_size=2147483647` once built a list of 2^31 ranks (23.8 GB). 131072 ranks is far
# beyond the largest jobs run today (tens of thousands of GPUs).
MAX_WORLD = 1 << 17

# ---------------------------------------------------------------- the HTTP service (faultline serve)
MAX_BODY_MB = 512  # one request body (413 past it): a day of a big job's logs, compressed
MAX_JSON_MB = 64  # a JSON body is decoded in memory (about 10x its size as Python objects): less
MAX_FILES = 20_000  # files of one upload: a per-rank layout of a 20k-GPU job
MAX_NAME = 1024  # characters of one uploaded file name (folders included)
MAX_NAME_PART = 255  # bytes of one part of it (what Linux file systems take)
WORKERS_MAX = 2  # diagnoses run at once: each may hold up to a block of lines per file and its candidates
QUEUE_TIMEOUT_S = 30.0  # a request waits this long for a free worker, then 503 (retry later)
# Large JSON bodies read at once (default workers_max + 2): a body is in memory while read, so twelve
# 40 MiB bodies read side by side once held 1.7 GB; the others wait, past queue_timeout_s they get 503.
BODY_SLOTS_EXTRA = 2
HEADER_TIMEOUT_S = 10.0  # a connection must send a complete request head within this (slowloris)
READ_TIMEOUT_S = 15.0  # longest pause between two pieces of a body (408 past it)
BODY_TIMEOUT_S = 300.0  # longest time to receive a whole body (408): 512 MB at ~1.7 MB/s
KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this
MAX_CONNECTIONS = 256  # open connections at once (503 past it): each holds a socket and a little memory
SESSION_LINES = 2_000_000  # log lines one session may hold (413 past it)
SESSION_MB = 256  # log text one session may hold (413 past it)

# ---------------------------------------------------------------- asking Slurm
# sacct for one job (by-reference diagnosis) and for a collect window. A hung slurmdbd must not hold a
# service worker for minutes: one job's rows come back in well under a second on a healthy cluster.
# Set per cluster (`scheduler: {sacct_timeout_s: ...}`) or by $FAULTLINE_SACCT_TIMEOUT_S.
SACCT_JOB_TIMEOUT_S = 20.0
SACCT_WINDOW_TIMEOUT_S = 120.0
SACCT_TIMEOUT_ENV = "FAULTLINE_SACCT_TIMEOUT_S"
