"""tokensel.Client against a secured TCP listener: a real tokensel-server with
TLS (a test CA and a certificate for 127.0.0.1/localhost made with the openssl
CLI here) and a bearer token, on loopback.

Without openssl these tests fail rather than skip (scripts/install-deps.sh
installs it): a skipped security test would hide a regression.
"""
import os
import re
import shutil
import subprocess
import tempfile
import time

import grpc
import numpy as np
import pytest

import tokensel
from conftest import Server, server_binary

TOKEN = "tokensel-pytest-token-0123456789abcdef"
WRONG_TOKEN = "not-the-tokensel-token-fedcba9876543210"

_PKI_SCRIPT = """set -e
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nbasicConstraints=CA:FALSE\\n\
keyUsage=digitalSignature,keyEncipherment\\nextendedKeyUsage=serverAuth\\n' >ext.cnf
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout ca.key -out ca.pem -days 2 -subj '/CN=tokensel pytest CA'
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout server.key -out server.csr -subj '/CN=localhost'
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
  -out server.pem -days 2 -extfile ext.cnf
"""


def _make_pki(directory):
    if shutil.which("openssl") is None:
        pytest.fail("openssl CLI not on PATH: cannot make test certificates "
                    "(scripts/install-deps.sh installs it)", pytrace=False)
    os.makedirs(directory, mode=0o700)
    done = subprocess.run(["sh", "-c", _PKI_SCRIPT], cwd=directory, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return os.path.join(directory, "ca.pem")


@pytest.fixture(scope="module")
def tls_server():
    with tempfile.TemporaryDirectory(prefix="tokensel-pytest-pki-") as d:
        ca = _make_pki(os.path.join(d, "pki"))
        wrong_ca = _make_pki(os.path.join(d, "other"))
        token_file = os.path.join(d, "token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(TOKEN + "\n")
        pki = os.path.join(d, "pki")
        srv = Server(server_binary(), [
            "--listen=127.0.0.1:0", "--tls_cert=" + os.path.join(pki, "server.pem"),
            "--tls_key=" + os.path.join(pki, "server.key"), "--auth_token_file=" + token_file])
        deadline = time.monotonic() + 10
        match = None
        while match is None and time.monotonic() < deadline:
            match = re.search(r"listening on (127\.0\.0\.1:\d+)", srv.log())
            time.sleep(0.02)
        assert match, srv.log()
        srv.tcp_target, srv.ca, srv.wrong_ca = match.group(1), ca, wrong_ca
        yield srv
        code = srv.stop()
        assert code == 0, "tokensel-server exited with %s:\n%s" % (code, srv.log())
        srv.dir.cleanup()


def _no_token_in(err):
    text = str(err)
    assert TOKEN not in text and WRONG_TOKEN not in text


def test_the_right_ca_and_token_run_ops(tls_server):
    with tokensel.Client(tls_server.tcp_target, tls_ca=tls_server.ca, auth_token=TOKEN,
                         client_name="pytest-tls") as client:
        client.ping()
        act = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
        ids = np.array([[0, 5], [1, 2]], dtype=np.int32)
        np.testing.assert_array_equal(client.gather_tokens(act, ids),
                                      np.take_along_axis(act, ids[:, :, None], axis=1))
        assert client.keep_alive() > 0


def test_ca_as_pem_bytes_an_https_target_and_a_server_name(tls_server):
    with open(tls_server.ca, "rb") as f:
        pem = f.read()
    with tokensel.Client("https://" + tls_server.tcp_target, tls_ca=pem, auth_token=TOKEN,
                         server_name="localhost") as client:
        client.ping()


def test_channel_credentials_argument(tls_server):
    with open(tls_server.ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    with tokensel.Client(tls_server.tcp_target, credentials=creds, auth_token=TOKEN) as client:
        client.ping()


def test_a_wrong_ca_is_a_tls_handshake_error(tls_server):
    with pytest.raises(tokensel.TlsHandshakeError) as info:
        tokensel.Client(tls_server.tcp_target, tls_ca=tls_server.wrong_ca, auth_token=TOKEN,
                        timeout=10)
    err = info.value
    assert isinstance(err, tokensel.UnavailableError)
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert "TLS handshake with %s failed" % tls_server.tcp_target in err.message
    assert tls_server.wrong_ca in err.message
    _no_token_in(err)


def test_a_server_name_the_certificate_lacks_is_a_tls_handshake_error(tls_server):
    with pytest.raises(tokensel.TlsHandshakeError, match="'not-tokensel.example'") as info:
        tokensel.Client(tls_server.tcp_target, tls_ca=tls_server.ca, auth_token=TOKEN,
                        server_name="not-tokensel.example", timeout=10)
    _no_token_in(info.value)


def test_a_missing_token_is_unauthenticated(tls_server):
    with pytest.raises(tokensel.UnauthenticatedError, match="bearer token missing") as info:
        tokensel.Client(tls_server.tcp_target, tls_ca=tls_server.ca, timeout=10)
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "auth_token=" in info.value.message


def test_a_wrong_token_is_permission_denied(tls_server):
    with pytest.raises(tokensel.PermissionDeniedError, match="wrong bearer token") as info:
        tokensel.Client(tls_server.tcp_target, tls_ca=tls_server.ca, auth_token=WRONG_TOKEN,
                        timeout=10)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    _no_token_in(info.value)


def test_plaintext_to_a_tls_port_says_tls_is_needed(tls_server):
    with pytest.raises(tokensel.UnavailableError, match="plaintext connection to") as info:
        tokensel.Client(tls_server.tcp_target, timeout=10)
    assert not isinstance(info.value, tokensel.TlsHandshakeError)
    assert "tls_ca=" in info.value.message


def test_contradicting_arguments_are_refused_before_any_call(tls_server):
    with pytest.raises(tokensel.InvalidArgumentError, match="never sent in clear"):
        tokensel.Client(tls_server.tcp_target, tls=False, auth_token=TOKEN)
    with pytest.raises(tokensel.InvalidArgumentError, match="never sent in clear"):
        tokensel.Client("http://" + tls_server.tcp_target, auth_token=TOKEN)
    with pytest.raises(tokensel.InvalidArgumentError, match="apply to TCP targets"):
        tokensel.Client(tls_server.target, auth_token=TOKEN)
    with pytest.raises(tokensel.InvalidArgumentError, match="not printable ASCII") as info:
        tokensel.Client(tls_server.tcp_target, tls_ca=tls_server.ca, auth_token="two words")
    _no_token_in(info.value)
    with pytest.raises(tokensel.InvalidArgumentError, match="no PEM certificate"):
        tokensel.Client(tls_server.tcp_target, tls_ca=b"not a certificate", auth_token=TOKEN)
