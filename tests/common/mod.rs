//! Shared harness for the root package's integration tests: the real
//! `squeeze` binary started as a child process (killed on drop, even when a
//! test panics), the skip-or-fail rule for missing client tools, and a small
//! hand-written NBD client for what the real clients cannot do (several
//! connections under one test's control, hostile bytes).

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use squeeze_nbd::proto::*;

pub const MIB: u64 = 1 << 20;

/// The `squeeze` binary under test.
pub fn squeeze() -> Command {
    Command::new(env!("CARGO_BIN_EXE_squeeze"))
}

/// A temp dir holding the volume `vol.sqz`, the NBD socket `s.sock`, the
/// control socket `vol.ctl` and the server's log `serve.log`.
pub struct Workdir {
    pub dir: tempfile::TempDir,
}

impl Workdir {
    pub fn new() -> Workdir {
        Workdir {
            dir: tempfile::Builder::new()
                .prefix("squeeze-serve-")
                .tempdir()
                .unwrap(),
        }
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    pub fn volume(&self) -> PathBuf {
        self.path("vol.sqz")
    }
    pub fn socket(&self) -> PathBuf {
        self.path("s.sock")
    }
    pub fn control(&self) -> PathBuf {
        self.path("vol.ctl")
    }
    pub fn log(&self) -> PathBuf {
        self.path("serve.log")
    }
    /// `squeeze create vol.sqz --size SIZE EXTRA...`.
    pub fn create(&self, size: &str, extra: &[&str]) {
        run(squeeze()
            .arg("create")
            .arg(self.volume())
            .arg("--size")
            .arg(size)
            .args(extra));
    }
}

/// `squeeze serve --socket s.sock vol.sqz ARGS...` running as a child. On
/// drop it gets SIGTERM, then SIGKILL if it does not exit within 10 s.
pub struct Serve {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
}

impl Serve {
    /// Starts the server on the work dir's volume (created by `serve` with
    /// `--size 1G` unless it exists) and waits until it is listening.
    pub fn start(w: &Workdir, args: &[&str]) -> Serve {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(w.log())
            .unwrap();
        let mut cmd = squeeze();
        cmd.arg("-v")
            .arg("serve")
            .arg("--socket")
            .arg(w.socket())
            .arg(w.volume());
        if !w.volume().exists() {
            cmd.arg("--size").arg("1G");
        }
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting squeeze serve");
        let mut s = Serve {
            child: Some(child),
            socket: w.socket(),
            control: w.control(),
            log: w.log(),
        };
        s.wait_ready();
        s
    }

    /// Waits for the "listening" banner (printed after the NBD and control
    /// sockets are bound); panics with the log if the server died.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            // The banner of this start: the log may hold earlier runs.
            let starts = log.matches("squeeze serve: listening on").count();
            let stops = log.matches("squeeze serve: volumes flushed").count()
                + log.matches("squeeze: error").count();
            if starts > stops && self.socket.exists() && self.control.exists() {
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("squeeze serve exited early ({st}):\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "squeeze serve not ready in 30 s:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// `nbd+unix:///?socket=...` (the empty export name selects the volume).
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// The same URI in qemu's spelling (qemu-io, qemu-img).
    pub fn qemu_uri(&self) -> String {
        self.uri()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// Sends `sig` and waits up to `timeout` for the exit status.
    pub fn signal_and_wait(&mut self, sig: i32, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        if child.try_wait().unwrap().is_none() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; asserts a clean exit (status 0) within 30 s.
    pub fn stop(mut self) {
        let st = self.signal_and_wait(libc::SIGTERM, Duration::from_secs(30));
        let log = self.log_text();
        match st {
            Some(st) => assert!(st.success(), "squeeze serve exited with {st}:\n{log}"),
            None => panic!("squeeze serve did not exit 30 s after SIGTERM:\n{log}"),
        }
    }

    /// A hand-written client connection, handshake done.
    pub fn client(&self, structured: bool) -> Client {
        let mut c = Client::connect(&self.socket);
        c.handshake("", structured);
        c
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if self
            .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
            .is_none()
        {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("--- squeeze serve log ---\n{}", self.log_text());
        }
    }
}

/// Whether a client tool is installed. Missing: a loud skip line, or a
/// panic under CI=true.
pub fn have_tool(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{tool} not installed and CI=true: client tests must run");
        }
        eprintln!("SKIPPED: {tool} not installed");
    }
    found
}

/// `tool` under `timeout 120`, so a hung client fails the test.
pub fn timed(tool: &str) -> Command {
    let mut c = Command::new("timeout");
    c.arg("120").arg(tool);
    c
}

/// Runs a command, panics with its output unless it succeeds; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

/// Runs a command; returns (success, stdout + stderr).
pub fn run_any(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

/// qemu-io on `uri` with the given `-c` commands; returns (success, output).
/// qemu-io exits 0 even when a command fails, so callers check the text.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> (bool, String) {
    let mut cmd = timed("qemu-io");
    cmd.arg("-f").arg("raw");
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    cmd.arg(uri);
    run_any(&mut cmd)
}

/// Asserts that qemu-io ran every command without an error or a pattern
/// mismatch.
pub fn qemu_io_ok(uri: &str, cmds: &[&str]) -> String {
    let (ok, out) = qemu_io(uri, cmds);
    assert!(ok, "qemu-io failed:\n{out}");
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.to_lowercase().contains("error"), "{out}");
    assert!(!out.contains("failed"), "{out}");
    out
}

/// Deterministic data mixing compressible text, random bytes and zero runs.
pub fn mixed_data(len: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(len);
    let mut block = 0u64;
    while v.len() < len {
        let n = (len - v.len()).min(64 << 10);
        match block % 4 {
            0 => v.extend((0..n).map(|i| b"squeeze serve test line\n"[i % 24])),
            1 => v.extend((0..n).map(|_| rng.gen::<u8>())),
            2 => v.extend(std::iter::repeat_n(0u8, n)),
            _ => v.extend((0..n).map(|i| (i / 512) as u8)),
        }
        block += 1;
    }
    v
}

/// Incompressible bytes (a seeded random stream).
pub fn random_data(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A real file of at least `min` bytes: binaries from /usr/bin (then text
/// from /usr/share) concatenated, written to `dst`. Returns its size.
pub fn real_file(dst: &Path, min: usize) -> usize {
    let mut out = Vec::with_capacity(min + (4 << 20));
    for dir in ["/usr/bin", "/usr/share/doc", "/usr/share/common-licenses"] {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        names.sort();
        for p in names {
            if out.len() >= min {
                break;
            }
            if p.is_file() {
                if let Ok(b) = std::fs::read(&p) {
                    out.extend_from_slice(&b[..b.len().min(4 << 20)]);
                }
            }
        }
    }
    assert!(out.len() >= min, "not enough real files for {min} bytes");
    // qemu-img wants whole sectors for a raw image's tail comparisons.
    out.resize(out.len().div_ceil(512) * 512, 0);
    std::fs::write(dst, &out).unwrap();
    out.len()
}

/// A protocol client written from the spec, byte by byte.
pub struct Client {
    pub s: UnixStream,
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
}

pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
pub fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Client {
            s,
            size: 0,
            flags: 0,
            structured: false,
        }
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    pub fn send_option(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// Option replies up to and including ACK or an error: (type, data).
    pub fn opt_replies(&mut self) -> Vec<(u32, Vec<u8>)> {
        let mut v = Vec::new();
        loop {
            let h = self.read_n(20);
            assert_eq!(be64(&h[0..8]), OPT_REPLY_MAGIC);
            let kind = be32(&h[12..16]);
            let data = self.read_n(be32(&h[16..20]) as usize);
            v.push((kind, data));
            if kind == REP_ACK || kind & (1 << 31) != 0 {
                return v;
            }
        }
    }

    /// Greeting, flags, optional STRUCTURED_REPLY, GO on `name`.
    pub fn handshake(&mut self, name: &str, structured: bool) {
        let g = self.read_n(18);
        assert_eq!(be64(&g[0..8]), NBDMAGIC);
        assert_eq!(be64(&g[8..16]), IHAVEOPT);
        self.s
            .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        if structured {
            self.send_option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(self.opt_replies().last().unwrap().0, REP_ACK);
            self.structured = true;
        }
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.send_option(OPT_GO, &d);
        for (kind, data) in self.opt_replies() {
            assert!(kind == REP_INFO || kind == REP_ACK, "GO refused: {kind:#x}");
            if kind == REP_INFO && be16(&data) == INFO_EXPORT {
                self.size = be64(&data[2..10]);
                self.flags = be16(&data[10..12]);
            }
        }
    }

    pub fn send_request(&mut self, cmd: u16, flags: u16, cookie: u64, off: u64, len: u32) {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        self.s.write_all(&b).unwrap();
    }

    /// One reply; returns (errno, cookie, read data of a simple reply).
    /// Structured chunks are consumed up to the one flagged DONE (use
    /// `read` for structured READ data).
    pub fn reply(&mut self, read_len: usize) -> (u32, u64, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            let m = be32(&self.read_n(4));
            if m == SIMPLE_REPLY_MAGIC {
                let h = self.read_n(12);
                let errno = be32(&h[0..4]);
                if errno == 0 && read_len > 0 {
                    data = self.read_n(read_len);
                }
                return (errno, be64(&h[4..12]), data);
            }
            assert_eq!(m, STRUCTURED_REPLY_MAGIC, "bad reply magic {m:#x}");
            let h = self.read_n(16);
            let flags = be16(&h[0..2]);
            let kind = be16(&h[2..4]);
            let cookie = be64(&h[4..12]);
            let payload = self.read_n(be32(&h[12..16]) as usize);
            if kind == REPLY_TYPE_ERROR {
                return (be32(&payload[0..4]), cookie, Vec::new());
            }
            if flags & REPLY_FLAG_DONE != 0 {
                return (0, cookie, data);
            }
        }
    }

    /// READ returning the bytes (simple or structured, data or holes).
    pub fn read(&mut self, off: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.send_request(CMD_READ, 0, 0x5151, off, len);
        let (errno, cookie, data) = self.reply_at(off, len as usize);
        assert_eq!(cookie, 0x5151);
        if errno == 0 {
            Ok(data)
        } else {
            Err(errno)
        }
    }

    fn reply_at(&mut self, off: u64, len: usize) -> (u32, u64, Vec<u8>) {
        if !self.structured {
            return self.reply(len);
        }
        // Rebase absolute chunk offsets on `off`.
        let mut data = vec![0u8; len];
        loop {
            let m = be32(&self.read_n(4));
            assert_eq!(m, STRUCTURED_REPLY_MAGIC, "bad reply magic {m:#x}");
            let h = self.read_n(16);
            let flags = be16(&h[0..2]);
            let kind = be16(&h[2..4]);
            let cookie = be64(&h[4..12]);
            let payload = self.read_n(be32(&h[12..16]) as usize);
            match kind {
                REPLY_TYPE_OFFSET_DATA => {
                    let rel = (be64(&payload[0..8]) - off) as usize;
                    data[rel..rel + payload.len() - 8].copy_from_slice(&payload[8..]);
                }
                REPLY_TYPE_OFFSET_HOLE => {
                    let rel = (be64(&payload[0..8]) - off) as usize;
                    let n = be32(&payload[8..12]) as usize;
                    data[rel..rel + n].fill(0);
                }
                REPLY_TYPE_ERROR => return (be32(&payload[0..4]), cookie, Vec::new()),
                _ => {}
            }
            if flags & REPLY_FLAG_DONE != 0 {
                return (0, cookie, data);
            }
        }
    }

    /// A command without read data; returns the errno (0 = success).
    pub fn cmd(&mut self, cmd: u16, flags: u16, off: u64, len: u32, data: &[u8]) -> u32 {
        self.send_request(cmd, flags, 0xbeef, off, len);
        self.s.write_all(data).unwrap();
        let (errno, cookie, _) = self.reply(0);
        assert_eq!(cookie, 0xbeef);
        errno
    }

    pub fn write(&mut self, off: u64, data: &[u8]) -> u32 {
        self.cmd(CMD_WRITE, 0, off, data.len() as u32, data)
    }

    pub fn flush(&mut self) -> u32 {
        self.cmd(CMD_FLUSH, 0, 0, 0, &[])
    }

    pub fn disconnect(mut self) {
        self.send_request(CMD_DISC, 0, 0, 0, 0);
        let mut rest = Vec::new();
        let _ = self.s.read_to_end(&mut rest);
    }

    /// True once the server has closed the connection.
    pub fn is_closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

/// `squeeze stats --json` against the running server's control socket:
/// the stats object of its first volume.
pub fn live_stats(srv: &Serve) -> serde_json::Value {
    let out = run(squeeze().arg("stats").arg("--json").arg(&srv.control));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.as_object()
        .and_then(|m| m.values().next().cloned())
        .unwrap_or_else(|| panic!("no volume in {out}"))
}

/// TLS material made with the openssl CLI in `dir`, laid out as qemu's
/// `tls-creds-x509` (endpoint=client) and libnbd's `tls-certificates`
/// want it: ca-cert.pem, server-cert.pem and server-key.pem (for
/// `localhost` and 127.0.0.1), client-cert.pem and client-key.pem, all
/// signed by a fresh CA. False (a loud skip, a failure under CI=true) if
/// openssl is missing.
pub fn tls_certs(dir: &Path) -> bool {
    if !have_tool("openssl") {
        return false;
    }
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"
set -e
cd "$1"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=squeeze test CA" \
  -keyout ca-key.pem -out ca-cert.pem \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout $who-key.pem -out $who.csr
  if [ $who = server ]; then eku=serverAuth; else eku=clientAuth; fi
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' $eku > $who.ext
  openssl x509 -req -in $who.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
    -days 3650 -extfile $who.ext -out $who-cert.pem
done
"#;
    run(Command::new("sh").arg("-c").arg(script).arg("sh").arg(dir));
    true
}

/// libnbd's URI for export `name` on a Unix socket, over TLS with the
/// certificates in `certs`.
pub fn nbds_uri(socket: &Path, name: &str, certs: &Path) -> String {
    format!(
        "nbds+unix:///{name}?socket={}&tls-certificates={}",
        socket.display(),
        certs.display()
    )
}

/// qemu's `--object` for client TLS credentials from `certs` (id tls0).
pub fn qemu_tls_object(certs: &Path) -> String {
    format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        certs.display()
    )
}

/// qemu's `--image-opts` for export `name` on a Unix socket over TLS (a
/// Unix socket has no host name, so the certificate's is given).
pub fn qemu_tls_image(socket: &Path, name: &str) -> String {
    format!(
        "driver=nbd,server.type=unix,server.path={},export={name},tls-creds=tls0,tls-hostname=localhost",
        socket.display()
    )
}

/// `squeeze serve`'s TLS arguments for the server certificate and key in
/// `certs`.
pub fn tls_args(certs: &Path) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        certs.join("server-cert.pem").display().to_string(),
        "--tls-key".into(),
        certs.join("server-key.pem").display().to_string(),
    ]
}

/// `qemu-img info` of export `name` over TLS with the client certificates
/// in `certs`; returns (success, output).
pub fn qemu_img_info_tls(certs: &Path, socket: &Path, name: &str) -> (bool, String) {
    let mut cmd = timed("qemu-img");
    cmd.arg("info")
        .arg("--object")
        .arg(qemu_tls_object(certs))
        .arg("--image-opts")
        .arg(qemu_tls_image(socket, name));
    run_any(&mut cmd)
}

/// qemu-io over TLS; returns (success, output) like `qemu_io`.
pub fn qemu_io_tls(certs: &Path, socket: &Path, name: &str, cmds: &[&str]) -> (bool, String) {
    let mut cmd = timed("qemu-io");
    cmd.arg("--object")
        .arg(qemu_tls_object(certs))
        .arg("--image-opts");
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    cmd.arg(qemu_tls_image(socket, name));
    run_any(&mut cmd)
}
