"""Bearer tokens with scopes, per-token request rates: who may do what (docs/service.md, "Authentication").

Tokens are never stored: the configuration holds the SHA-256 of each (tokens are random and long, so
a fast hash is safe), with a name, scopes and limits:

    tokens:
      - name: recovery-bot
        sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
        scopes: [read, diagnose]
        rate_per_minute: 600      # requests; 429 with Retry-After past it (default 600, burst a tenth)
        max_sessions: 100         # open sessions at once (default 100)

from a file (`faultline serve --tokens FILE`) or the environment (`FAULTLINE_TOKENS`, the same YAML or
JSON). `faultline token new --name NAME --scopes read,diagnose` makes a token and prints its entry.
Without tokens the service is open (it listens on loopback by default).

Scopes: `read` (GET: stored diagnoses, rules, sessions and their verdicts), `diagnose` (POST
/v1/diagnose, create sessions, send observations, attribute, delete its own sessions), `admin`
(everything, every token's sessions). `/healthz` and the docs pages need no token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SCOPES = ("read", "diagnose", "admin")
ENV = "FAULTLINE_TOKENS"
OPEN_PATHS = ("/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
OPEN_PREFIXES = ("/static/",)
_HEX64 = set("0123456789abcdef")


class AuthConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Token:
    name: str
    sha256: str
    scopes: frozenset[str]
    rate_per_minute: float = 600
    burst: int = 60
    max_sessions: int = 100


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return "fl_" + secrets.token_urlsafe(32)


def parse_tokens(text: str, where: str) -> tuple[Token, ...]:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise AuthConfigError(f"{where}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
    entries = doc.get("tokens") if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise AuthConfigError(f"{where}: expected `tokens:` with a list of {{name, sha256, scopes}}")
    out, names, hashes = [], set(), set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise AuthConfigError(f"{where}: token {i} is not a mapping")
        unknown = set(e) - {"name", "sha256", "scopes", "rate_per_minute", "burst", "max_sessions"}
        if unknown:
            raise AuthConfigError(f"{where}: token {i}: unknown key(s) {', '.join(sorted(unknown))}")
        name, digest = str(e.get("name") or ""), str(e.get("sha256") or "").lower().removeprefix("sha256:")
        if not name or name in names:
            raise AuthConfigError(f"{where}: token {i}: a unique `name` is required")
        if len(digest) != 64 or not set(digest) <= _HEX64 or digest in hashes:
            raise AuthConfigError(f"{where}: token {name!r}: `sha256` must be a unique 64-digit hex digest "
                                  "(never the token itself)")
        scopes = e.get("scopes") or []
        if isinstance(scopes, str):
            scopes = [s.strip() for s in scopes.split(",")]
        bad = [s for s in scopes if s not in SCOPES]
        if bad or not scopes:
            raise AuthConfigError(f"{where}: token {name!r}: scopes are some of {', '.join(SCOPES)}")
        rate = float(e.get("rate_per_minute", 600))
        burst = int(e.get("burst", max(1, math.ceil(rate / 10))))
        max_sessions = int(e.get("max_sessions", 100))
        if rate <= 0 or burst < 1 or max_sessions < 0:
            raise AuthConfigError(f"{where}: token {name!r}: rate_per_minute and burst must be positive")
        names.add(name)
        hashes.add(digest)
        out.append(Token(name, digest, frozenset(scopes), rate, burst, max_sessions))
    return tuple(out)


def load_tokens(path: Path | None, environ=os.environ) -> tuple[Token, ...]:
    """The configured tokens: the file if given, else $FAULTLINE_TOKENS, else none (auth off)."""
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise AuthConfigError(f"--tokens {path}: {exc.strerror or exc}") from None
        return parse_tokens(text, str(path))
    if environ.get(ENV):
        return parse_tokens(environ[ENV], f"${ENV}")
    return ()


def required_scope(method: str, path: str) -> str | None:
    """The scope a request needs; None for the open pages."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return None
    if path.startswith("/v2/admin"):
        return "admin"
    if method in ("GET", "HEAD", "OPTIONS"):
        return "read"
    return "diagnose"


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Authenticator:
    tokens: tuple[Token, ...] = ()
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def identify(self, authorization: str | None) -> Token | None:
        """The token a request's `Authorization: Bearer ...` carries; None when absent or unknown.
        Every configured hash is compared in constant time, so timing tells nothing."""
        if not authorization:
            return None
        kind, _, value = authorization.strip().partition(" ")
        if kind.lower() != "bearer" or not value.strip():
            return None
        digest = hash_token(value.strip())
        found = None
        for t in self.tokens:
            if hmac.compare_digest(t.sha256, digest):
                found = t
        return found

    def take(self, token: Token, now: float | None = None) -> float:
        """One request of `token` against its rate: 0 when allowed, else the seconds until one is."""
        now = time.monotonic() if now is None else now
        refill = token.rate_per_minute / 60.0
        with self._lock:
            b = self._buckets.get(token.name)
            if b is None:
                b = self._buckets[token.name] = _Bucket(float(token.burst), now)
            b.tokens = min(float(token.burst), b.tokens + (now - b.at) * refill)
            b.at = now
            if b.tokens >= 1:
                b.tokens -= 1
                return 0.0
            return (1 - b.tokens) / refill


def token_entry(name: str, scopes: list[str], token: str) -> str:
    return json.dumps({"name": name, "sha256": hash_token(token), "scopes": scopes})
