"""Certificate renewal without a restart: on SIGHUP `agent-mail serve` reads its --tls-cert and --tls-key again
(certbot's deploy hook, or systemd's ExecReload, sends it). The pair is first loaded into a context of its own: a
certificate that does not match its key, or a file half written, is refused with a log line and the server goes
on with the pair it had. Connections already open keep theirs; every handshake after the reload gets the new one.
"""

from __future__ import annotations

import signal


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
