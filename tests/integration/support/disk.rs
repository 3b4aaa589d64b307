//! A small tmpfs to make a really full disk, and plain blocking HTTP for the disk tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A tmpfs mounted on a fresh directory, unmounted (and removed) on drop.
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `1m`). `None`, after a loud SKIP, when not root (CI
    /// runs as root). As root a failing mount is a test failure.
    pub fn mount(name: &str, size: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "\n*** SKIP {name}: not root, cannot mount a tmpfs to fill a disk (CI runs as root) ***\n"
            );
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("llmreplay-tmpfs-{}-{name}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount -t tmpfs failed as root: {st:?}");
        Some(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Fills the file system (file `fill`) until a write fails with ENOSPC.
    pub fn fill(&self) {
        let mut f = std::fs::File::create(self.dir.join("fill")).expect("create fill");
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // Also the last bytes: a file's partly used page could still take a short write.
        let one = [0u8; 1];
        while f.write(&one).is_ok_and(|n| n == 1) {}
    }

    /// Frees the space `fill` took.
    pub fn free(&self) {
        std::fs::remove_file(self.dir.join("fill")).expect("remove fill");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`): status and body
/// (chunked bodies decoded).
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("response head");
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    if !chunked {
        return (status, rest.to_string());
    }
    let mut out = String::new();
    let mut rest = rest;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    (status, out)
}

/// The value of an unlabelled metric in a Prometheus exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
