"""Uploaded files: their names made safe (pure), and the files written into a private folder (I/O).

A name keeps its folders (`node-a/syslog`: folder and file names are node, rank and source hints),
but can never leave the folder it is written into: absolute paths, drive letters and `..` are
refused, `\\` counts as a folder separator, `.` and empty parts are dropped.
"""

from __future__ import annotations

import base64
import binascii
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from faultline.limits import MAX_NAME, MAX_NAME_PART
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")
COPY_BLOCK = 1 << 20


class BadUpload(ValueError):
    """A file name or content the API refuses (a 400)."""


@dataclass
class Upload:
    """One file of a job as it arrived: a safe name and one of text, base64 text or an open file."""

    name: PurePosixPath
    text: str | None = None
    b64: str | None = None
    stream: BinaryIO | None = None


def safe_name(name: str) -> PurePosixPath:
    """`name` as a relative path that stays inside the upload folder, or BadUpload."""
    if not isinstance(name, str) or not name.strip():
        raise BadUpload("a file needs a non-empty name")
    if len(name) > MAX_NAME:
        raise BadUpload(f"file name longer than {MAX_NAME} characters")
    if _CONTROL.search(name) or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise BadUpload(f"file name {name[:80]!r} has control or invalid characters")
    unified = name.replace("\\", "/")
    if unified.startswith("/") or _DRIVE.match(unified):
        raise BadUpload(f"file name {name[:200]!r} is absolute; give a relative name such as node-a/syslog")
    parts = [p for p in unified.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise BadUpload(f"file name {name[:200]!r} leaves its folder ('..')")
    if not parts:
        raise BadUpload(f"file name {name[:200]!r} names no file")
    if any(len(p.encode("utf-8")) > MAX_NAME_PART for p in parts):
        raise BadUpload(f"file name {name[:200]!r} has a part longer than {MAX_NAME_PART} bytes")
    return PurePosixPath(*parts)


def check_names(names: list[PurePosixPath], max_files: int) -> None:
    """One job's names: at least one, not too many, no duplicates, no name that is another's folder."""
    if not names:
        raise BadUpload("no files: give at least one, or leave `files` out to diagnose by reference")
    if len(names) > max_files:
        raise BadUpload(f"{len(names)} files; at most {max_files} per request")
    seen: set[PurePosixPath] = set()
    for n in names:
        if n in seen:
            raise BadUpload(f"file name {str(n)!r} is given twice")
        seen.add(n)
    folders = {p for n in names for p in n.parents}
    clash = sorted(str(n) for n in names if n in folders)
    if clash:
        raise BadUpload(f"{clash[0]!r} is both a file and a folder of other files")


def write_upload(root: Path, uploads: list[Upload]) -> list[Path]:
    """Write each upload under `root` (which must exist and be private); the written paths, sorted as
    `faultline diagnose` orders the files of a folder."""
    written = []
    for up in uploads:
        path = root.joinpath(*up.name.parts)
        if root not in path.parents:  # safe_name makes this impossible; never trust one check alone
            raise BadUpload(f"file name {str(up.name)!r} leaves the upload folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as out:
            if up.stream is not None:
                up.stream.seek(0)
                shutil.copyfileobj(up.stream, out, COPY_BLOCK)
            elif up.b64 is not None:
                out.write(decode_b64(up.b64, up.name))
            else:
                # Lone surrogates (JSON's \udcXX escapes) become invalid UTF-8, which the reader then
                # replaces and counts, as it does for any file with bad bytes.
                out.write((up.text or "").encode("utf-8", "surrogatepass"))
        written.append(path)
    return sorted(written)


def decode_b64(text: str, name: PurePosixPath) -> bytes:
    for attempt in (text, None):
        try:
            if attempt is None:  # wrapped at 76 columns, as `base64` and MIME write it
                attempt = "".join(text.split())
            return base64.b64decode(attempt, validate=True)
        except (binascii.Error, ValueError):
            continue
    raise BadUpload(f"file {str(name)!r}: `base64` is not valid base64")
