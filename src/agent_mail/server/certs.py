"""The TLS pair of `agent-mail serve`: checked before it listens, and renewed without a restart.

Before the server listens, `problems` reads both files as the server's own user and loads them as a pair: a file it
cannot read (a key only root may read, under a service's user), a certificate that is not one, a key that is
encrypted or not the certificate's, is a wrong call (exit 2) naming its flag. uvicorn would load them only once
serving, after "listening" was said, and the error was an internal one.

On SIGHUP (certbot's deploy hook, or systemd's ExecReload) serve reads --tls-cert and --tls-key again. The pair is
first loaded into a context of its own: a certificate that does not match its key, or a file half written, is
refused with a log line and the server goes on with the pair it had. Connections already open keep theirs; every
handshake after the reload gets the new one.
"""

from __future__ import annotations

import os
import signal


class _Encrypted(Exception):
    """The key asked for a password: serve takes none (it would prompt on the terminal of a service)."""


def _refused(exc: BaseException) -> str:
    return f"{exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)


def _unreadable(path: str) -> str | None:
    """Why this process cannot read `path`, or None: opened here, as the server's own user."""
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except FileNotFoundError:
        return f"{path!r} does not exist."
    except IsADirectoryError:
        return f"{path!r} is a directory, not a PEM file."
    except PermissionError:
        return (f"{path!r} cannot be read by the user this server runs as (uid {os.geteuid()}). Make it readable "
                "to that user, or hand it over as systemd does with LoadCredential= (docs/deployment.md).")
    except OSError as exc:
        return f"{path!r} cannot be read ({_refused(exc)})."
    return None


def problems(cert: str | None, key: str | None) -> list[tuple[str, str]]:
    """What is wrong with the pair serve was given, by flag: each file readable, the certificate a PEM certificate,
    the key an unencrypted PEM key matching it. Empty when TLS can be served with them."""
    import ssl

    found = [(flag, why) for flag, path in (("tls_cert", cert), ("tls_key", key))
             if path and (why := _unreadable(path)) is not None]
    if found or not cert or not key:
        return found
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except (ssl.SSLError, ValueError) as exc:
        return [("tls_cert", f"{cert!r} holds no PEM certificate ({getattr(exc, 'reason', None) or exc}).")]

    def no_password():
        raise _Encrypted

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=no_password)
    except _Encrypted:
        return [("tls_key", f"{key!r} is encrypted: give the key unencrypted (openssl pkey -in KEY -out PLAIN), "
                            "readable only by the server's user.")]
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            return [("tls_key", f"{key!r} is not the key of the certificate in {cert!r}.")]
        because = f" ({exc.reason})" if exc.reason else ""
        return [("tls_key", f"{key!r} holds no PEM private key{because}.")]
    except OSError as exc:
        return [("tls_key", f"{key!r} cannot be read ({_refused(exc)}).")]
    return []


def reload_on_sighup(server, cert: str, key: str, log) -> None:
    """Install the SIGHUP handler for `server` (uvicorn's, whose config.ssl is the live context once started)."""
    def reload(signum, frame) -> None:
        import ssl

        live = getattr(server.config, "ssl", None)
        if live is None:
            log(tls_reloaded=False, reason="the server has not started serving TLS yet")
            return
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)  # the new pair, checked apart
            live.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            log(tls_reloaded=False, cert=cert, reason=f"{type(exc).__name__}: {exc}; the previous certificate is "
                                                      "still served")
            return
        log(tls_reloaded=True, cert=cert)
    signal.signal(signal.SIGHUP, reload)
