"""How tokensel.Client reaches a secured TCP listener (the server's
--tls_cert/--tls_key/--auth_token_file), and errors that say which of TLS
or the token failed.

Which connection a target gets:
  unix:///path        plaintext, no token (the socket's file mode is the
                      authentication); TLS or token arguments are refused
  https://host:port   TLS (the scheme is dropped: gRPC dials host:port)
  host:port           TLS when tls=True, tls_ca, server_name, auth_token or
                      credentials is given; plaintext otherwise (a server
                      started with --insecure_tcp)
A token is never sent without TLS. It travels as "authorization: Bearer
<token>" (grpc.access_token_call_credentials) and is never part of a
message this module makes.
"""
import os

import grpc

from tokensel import errors


def _tls_failure(details):
    """What gRPC's UNAVAILABLE says about a failed TLS handshake (its words
    differ between versions and TLS libraries): "ca", "name", "not_tls",
    "other" or None."""
    d = details.lower()
    if "verify failed" in d or "verify_failed" in d:
        return "ca"
    if "not in peer certificate" in d or "hostname verification" in d:
        return "name"
    if "wrong version number" in d or "wrong_version_number" in d:
        return "not_tls"
    if any(m in d for m in ("handshake", "ssl", "certificate", "tls", "tsi_", "security")):
        return "other"
    return None


class Security:
    """What one target resolves to: `target` (what gRPC dials), `tcp`,
    `tls`, `ca_source` / `token_source` (for messages), `server_name`."""

    def __init__(self, target, *, tls=None, tls_ca=None, server_name=None, auth_token=None,
                 credentials=None):
        self.target = target
        self.tcp = not target.startswith("unix:")
        self.server_name = server_name
        self._token = None
        self._credentials = None
        asked = (tls or tls_ca is not None or server_name is not None
                 or auth_token is not None or credentials is not None)
        if not self.tcp:
            if asked:
                raise errors.InvalidArgumentError(
                    "tls, tls_ca, server_name, auth_token and credentials apply to TCP "
                    "targets; a unix socket is authenticated by its file mode")
            self.tls = False
            return
        scheme_tls = None
        for scheme, is_tls in (("https://", True), ("http://", False)):
            if target.startswith(scheme):
                self.target, scheme_tls = target[len(scheme):].rstrip("/"), is_tls
        if tls is False or scheme_tls is False:
            if tls or tls_ca is not None or server_name is not None or auth_token is not None \
                    or credentials is not None:
                raise errors.InvalidArgumentError(
                    "plaintext was asked for (tls=False or http://), but TLS or token "
                    "arguments were given (a token is never sent in clear)")
            self.tls = False
            return
        self.tls = bool(scheme_tls or asked)
        if not self.tls:
            return
        if auth_token is not None:
            token = auth_token.decode() if isinstance(auth_token, bytes) else str(auth_token)
            token = token.strip()
            bad = [i for i, c in enumerate(token) if not "\x21" <= c <= "\x7e"]
            if not token or bad:
                raise errors.InvalidArgumentError(
                    "auth_token: the token is empty" if not token else
                    "auth_token: character %d of the token is not printable ASCII (spaces "
                    "and control characters cannot be sent after 'Bearer ')" % bad[0])
            self._token = token
        self.token_source = "auth_token" if self._token else None
        if credentials is not None:
            self.ca_source = "the given credentials"
            channel_credentials = credentials
        else:
            pem = None
            self.ca_source = "the system roots"
            if isinstance(tls_ca, bytes):
                pem, self.ca_source = tls_ca, "tls_ca (PEM bytes)"
            elif tls_ca is not None:
                self.ca_source = "tls_ca=%s" % os.fspath(tls_ca)
                try:
                    with open(tls_ca, "rb") as f:
                        pem = f.read()
                except OSError as err:
                    raise errors.InvalidArgumentError(
                        "%s: cannot read: %s" % (self.ca_source, err.strerror)) from None
            if pem is not None and b"-----BEGIN CERTIFICATE-----" not in pem:
                raise errors.InvalidArgumentError(
                    "%s: no PEM certificate (-----BEGIN CERTIFICATE-----)" % self.ca_source)
            channel_credentials = grpc.ssl_channel_credentials(root_certificates=pem)
        if self._token is not None:
            channel_credentials = grpc.composite_channel_credentials(
                channel_credentials, grpc.access_token_call_credentials(self._token))
        self._credentials = channel_credentials

    @property
    def token_sent(self):
        return self._token is not None

    def channel(self, options):
        """A new channel to the target with `options` (plus the server name
        override)."""
        if not self.tls:
            return grpc.insecure_channel(self.target, options=options)
        if self.server_name:
            options = list(options) + [("grpc.ssl_target_name_override", self.server_name)]
        return grpc.secure_channel(self.target, self._credentials, options=options)

    def explain(self, error):
        """`error` (a TokenselError) reworded to say what failed: a TLS
        handshake (TlsHandshakeError, an UnavailableError), a plaintext
        connection a TLS port dropped, a missing or malformed token
        (UnauthenticatedError), a wrong token (PermissionDeniedError). The
        server's or gRPC's words follow in parentheses; anything else is
        returned as is."""
        if not self.tcp:
            return error
        said = " (%s)" % error.message
        code = error.code
        if code == grpc.StatusCode.UNAVAILABLE:
            failure = _tls_failure(error.message) if self.tls else None
            if failure is not None:
                name = "'%s'" % self.server_name if self.server_name else "the target's host"
                why = {
                    "ca": "the server's certificate is not signed by a CA of %s" % self.ca_source,
                    "name": "the server's certificate does not name %s (server_name)" % name,
                    "not_tls": "the port does not speak TLS (a server started with "
                               "--insecure_tcp? then tls=False, and no token)",
                }.get(failure, "the server's certificate is not signed by a CA of %s, does not "
                               "name %s, or the port does not speak TLS" % (self.ca_source, name))
                return errors.TlsHandshakeError(
                    "TLS handshake with %s failed: %s%s" % (self.target, why, said))
            # A TLS port drops a plaintext client's connection ("Socket closed").
            lowered = error.message.lower()
            if not self.tls and ("socket closed" in lowered or "connection reset" in lowered):
                return errors.UnavailableError(
                    "plaintext connection to %s failed; a server with TLS needs tls_ca= (or "
                    "tls=True for the system roots) and auth_token=%s" % (self.target, said))
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            if not self.token_sent:
                return errors.UnauthenticatedError(
                    "bearer token missing: the server wants one; pass auth_token=%s" % said)
            return errors.UnauthenticatedError(
                "bearer token from %s not accepted as one%s" % (self.token_source, said))
        elif code == grpc.StatusCode.PERMISSION_DENIED:
            if self.token_sent and "invalid bearer token" in error.message:
                return errors.PermissionDeniedError(
                    "wrong bearer token: the server refused the token from %s%s"
                    % (self.token_source, said))
        return error
