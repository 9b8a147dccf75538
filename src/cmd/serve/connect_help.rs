//! What `squeeze serve` prints once it listens: for each listener, the
//! URIs and commands that connect to it (qemu, libnbd, nbd-client, fio),
//! with TLS where it is on; then `squeeze stats` and the metrics URL.

use super::args::DEFAULT_LISTEN;
use squeeze_nbd::{Listener, TlsMode};
use std::path::Path;

pub(super) fn print_connect_help(
    listeners: &[Listener],
    exports: &[String],
    tls: Option<TlsMode>,
    control: &Path,
    metrics: Option<&str>,
) {
    let first = &exports[0];
    // libnbd spells TLS with an "s"; qemu needs a tls-creds object.
    for l in listeners {
        let (uri, tls_uri, qemu_tls) = match l {
            Listener::Tcp(t) => {
                let a = t
                    .local_addr()
                    .map_or_else(|_| DEFAULT_LISTEN.into(), |a| a.to_string());
                let (host, port) = a.rsplit_once(':').unwrap_or((&a, "10809"));
                (
                    format!("nbd://{a}/{first}"),
                    format!("nbds://{a}/{first}?tls-certificates=CERTDIR"),
                    format!("driver=nbd,server.type=inet,server.host={host},server.port={port},export={first},tls-creds=tls0"),
                )
            }
            Listener::Unix(_, p) => (
                format!("nbd+unix:///{first}?socket={}", p.display()),
                format!(
                    "nbds+unix:///{first}?socket={}&tls-certificates=CERTDIR",
                    p.display()
                ),
                format!(
                    "driver=nbd,server.type=unix,server.path={},export={first},tls-creds=tls0,tls-hostname=localhost",
                    p.display()
                ),
            ),
        };
        noteln!("squeeze serve: listening on {}", l.describe());
        noteln!("  exports: {}", exports.join(", "));
        if let Some(mode) = tls {
            let m = if mode == TlsMode::Require {
                "required"
            } else {
                "offered"
            };
            noteln!("  TLS {m}; CERTDIR holds ca-cert.pem (and client-cert.pem, client-key.pem);");
            noteln!("  qemu's tls-hostname is a name in the server certificate");
            noteln!("  nbdinfo '{tls_uri}'");
            noteln!(
                "  qemu-img info --object tls-creds-x509,id=tls0,endpoint=client,dir=CERTDIR --image-opts '{qemu_tls}'"
            );
            if mode == TlsMode::Require {
                continue;
            }
        }
        noteln!("  qemu-img info '{uri}'");
        noteln!("  qemu-io -f raw '{uri}' -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'");
        noteln!("  nbdinfo --map '{uri}'");
        noteln!("  nbdfuse /mnt/squeeze '{uri}'");
        if let Listener::Tcp(t) = l {
            if let Ok(a) = t.local_addr() {
                noteln!("  nbd-client {} {} /dev/nbd0 -N {first}", a.ip(), a.port());
            }
        }
        noteln!("  fio --ioengine=nbd --uri='{uri}' --rw=write --bs=128k --iodepth=32 --size=1g --name=w");
    }
    noteln!("  squeeze stats {}", control.display());
    if let Some(m) = metrics {
        noteln!("  curl http://{m}/metrics");
    }
}
