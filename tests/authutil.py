"""Local stand-ins for Google's credential edge, for tests that authenticate for real.

- :func:`make_tls_pair`: a self-signed certificate for 127.0.0.1 and localhost.
- :func:`make_service_account_key`: an RSA key and its service-account JSON,
  whose ``token_uri`` points at a :class:`LocalAuthServer`.
- :class:`LocalAuthServer`: an HTTP server on loopback (a thread) that is both
  an OAuth 2 token endpoint (JWT-bearer grants, checked against the key's
  public half, and refresh-token grants) and a GCE/GKE metadata server
  (``Metadata-Flavor: Google``). It remembers every token it issued and when
  it expires, so ``server.token_is_valid`` can be the emulator's validator.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

SERVICE_ACCOUNT_EMAIL = "mount-test@rapidmount-test.iam.gserviceaccount.com"
PROJECT_ID = "rapidmount-test"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


def make_tls_pair() -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for 127.0.0.1 and localhost; the certificate is its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rapidmount test endpoint")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    return (certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


@dataclass
class ServiceAccountKey:
    info: dict
    private_pem: str
    public_pem: bytes

    def write(self, path) -> str:
        with open(path, "w") as f:
            json.dump(self.info, f)
        return str(path)


def make_service_account_key(token_uri: str) -> ServiceAccountKey:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    info = {
        "type": "service_account",
        "project_id": PROJECT_ID,
        "private_key_id": secrets.token_hex(20),
        "private_key": private_pem,
        "client_email": SERVICE_ACCOUNT_EMAIL,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
    }
    return ServiceAccountKey(info, private_pem, public_pem)


def refresh_token_info(token_uri: str, refresh_token: str) -> dict:
    """Refresh-token credentials as ``gcloud auth application-default login`` writes them
    for workforce identity users. (google-auth sends plain ``authorized_user``
    files to Google's token endpoint whatever they say; this type honours ``token_url``.)"""
    return {"type": "external_account_authorized_user",
            "audience": "//iam.googleapis.com/locations/global/workforcePools/test-pool/providers/test",
            "client_id": "rapidmount-test-client", "client_secret": "client-secret-" + secrets.token_hex(8),
            "refresh_token": refresh_token, "token_url": token_uri}


class _QuietHTTPServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up waiting (see hold) is expected here


@dataclass
class _State:
    lifetime_s: float = 3600.0
    refuse: str | None = None  # "invalid_grant" (400) or "unavailable" (503)
    public_pems: list[bytes] = field(default_factory=list)
    refresh_tokens: set[str] = field(default_factory=set)
    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)
    hits: dict[str, int] = field(default_factory=dict)


class LocalAuthServer:
    """A token endpoint and metadata server on 127.0.0.1 (see the module docstring)."""

    def __init__(self, lifetime_s: float = 3600.0, fixed_token: str | None = None) -> None:
        """``fixed_token``: issue this token every time (for an emulator's --require-token)."""
        self._fixed_token = fixed_token
        self._lock = threading.Lock()
        self._state = _State(lifetime_s=lifetime_s)
        self._answer = threading.Event()  # cleared: token requests wait (see hold)
        self._answer.set()
        self.waiting = threading.Event()  # set once a token request waits on hold
        handler = self._handler_class()
        self._server = _QuietHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-auth", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> LocalAuthServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    @property
    def token_uri(self) -> str:
        return f"http://{self.address}/token"

    def metadata_env(self) -> dict[str, str]:
        """Environment that sends google-auth's metadata-server traffic here."""
        return {"GCE_METADATA_HOST": self.address, "GCE_METADATA_IP": self.address}

    # -- control and inspection -------------------------------------------------------------------

    def trust_key(self, key: ServiceAccountKey) -> None:
        with self._lock:
            self._state.public_pems.append(key.public_pem)

    def add_refresh_token(self) -> str:
        token = "refresh-" + secrets.token_urlsafe(24)
        with self._lock:
            self._state.refresh_tokens.add(token)
        return token

    def set_lifetime(self, seconds: float) -> None:
        with self._lock:
            self._state.lifetime_s = seconds

    def refuse(self, how: str | None) -> None:
        """Make token requests fail: "invalid_grant" (400), "unavailable" (503), or None."""
        with self._lock:
            self._state.refuse = how

    def hold(self) -> None:
        """Make token requests wait until :meth:`release` (a slow endpoint)."""
        self.waiting.clear()
        self._answer.clear()

    def release(self) -> None:
        self._answer.set()

    def hits(self, kind: str) -> int:
        with self._lock:
            return self._state.hits.get(kind, 0)

    def issued_tokens(self) -> list[str]:
        with self._lock:
            return list(self._state.issued)

    def token_is_valid(self, token: str) -> bool:
        """Issued here and not expired: the emulator's token validator."""
        with self._lock:
            expiry = self._state.issued.get(token)
        return expiry is not None and time.monotonic() < expiry

    # -- the HTTP side ----------------------------------------------------------------------------

    def _count(self, kind: str) -> None:
        with self._lock:
            self._state.hits[kind] = self._state.hits.get(kind, 0) + 1

    def _issue(self) -> tuple[int, dict]:
        if not self._answer.is_set():
            self.waiting.set()
            self._answer.wait(60)
        with self._lock:
            refuse, lifetime = self._state.refuse, self._state.lifetime_s
            if refuse == "invalid_grant":
                return 400, {"error": "invalid_grant", "error_description": "Account has been disabled."}
            if refuse == "unavailable":
                return 503, {"error": "backend_error", "error_description": "try again later"}
            token = self._fixed_token or "ya29.local-" + secrets.token_urlsafe(32)
            self._state.issued[token] = time.monotonic() + lifetime
        return 200, {"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}

    def _grant(self, form: dict[str, str]) -> tuple[int, dict]:
        import google.auth.jwt

        grant = form.get("grant_type", "")
        if grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            self._count("jwt-bearer")
            with self._lock:
                keys = list(self._state.public_pems)
            for public_pem in keys:
                try:
                    # google-auth signs for Google's token endpoint whatever token_uri says.
                    claims = google.auth.jwt.decode(form.get("assertion", ""), certs=public_pem,
                                                    audience=[self.token_uri, GOOGLE_TOKEN_AUDIENCE])
                except ValueError:
                    continue
                if claims.get("iss") == SERVICE_ACCOUNT_EMAIL and "devstorage" in claims.get("scope", ""):
                    return self._issue()
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        if grant == "refresh_token":
            self._count("refresh_token")
            with self._lock:
                known = form.get("refresh_token") in self._state.refresh_tokens
            if not known:
                return 400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."}
            return self._issue()
        return 400, {"error": "unsupported_grant_type"}

    def _metadata(self, path: str, query: dict[str, str]) -> tuple[int, object]:
        prefix = "/computeMetadata/v1/"
        if not path.startswith(prefix):
            return 404, "not found"
        item = path[len(prefix):]
        if item == "project/project-id":
            return 200, PROJECT_ID
        if item == "universe/universe-domain":
            return 200, "googleapis.com"
        if item == "instance/service-accounts/default/" and query.get("recursive") == "true":
            return 200, {"email": SERVICE_ACCOUNT_EMAIL, "aliases": ["default"],
                         "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
        if item == "instance/service-accounts/default/token":
            self._count("metadata-token")
            return self._issue()
        return 404, "not found"

    def _handler_class(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # keep test output quiet
                pass

            def _reply(self, status: int, body: object, flavor: bool = False) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
                if flavor:
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, "Missing Metadata-Flavor: Google header")
                    return
                if url.path == "/":
                    server._count("ping")
                    self._reply(200, "ok", flavor=True)
                    return
                query = dict(urllib.parse.parse_qsl(url.query))
                status, body = server._metadata(url.path, query)
                self._reply(status, body, flavor=True)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                if urllib.parse.urlsplit(self.path).path != "/token":
                    self._reply(404, "not found")
                    return
                status, body = server._grant(form)
                self._reply(status, body)

        return Handler


# -- for mounts that authenticate -------------------------------------------------------------------------


class SeenTokens:
    """The emulator's validator: tokens the local endpoint issued and that are still valid."""

    def __init__(self, server: LocalAuthServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self.accepted: set[str] = set()

    def __call__(self, token: str) -> bool:
        valid = self._server.token_is_valid(token)
        if valid:
            with self._lock:
                self.accepted.add(token)
        return valid


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def clean_env(tmp_path, **extra: str) -> dict[str, str]:
    """An environment with no Google credentials at all, plus ``extra``."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    nowhere = closed_port()  # google-auth's metadata-server probe gets "connection refused"
    env.update(HOME=str(home), CLOUDSDK_CONFIG=str(home / "gcloud"), GCE_METADATA_HOST=nowhere,
               GCE_METADATA_IP=nowhere)
    env.update(extra)
    return env


def trusted_key_file(server: LocalAuthServer, tmp_path) -> tuple[ServiceAccountKey, str]:
    """A service-account key that ``server`` trusts, written to tmp_path/key.json."""
    key = make_service_account_key(server.token_uri)
    server.trust_key(key)
    return key, key.write(tmp_path / "key.json")


def secret_lines(text: str) -> list[str]:
    """Lines of a PEM body: any one of them in a log would be a leak."""
    return [line for line in text.splitlines() if line and not line.startswith("-----")]
