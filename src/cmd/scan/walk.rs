//! Finding and reading the inputs of `scan`: a directory walk that does not
//! follow symlinks, the data extents of each file (SEEK_DATA/SEEK_HOLE, so
//! holes in sparse files and images are neither read nor counted), and the
//! plan of which 128 KiB pieces to read.
//!
//! Invariants:
//! - A path that cannot be read is reported (stderr and the report) and
//!   skipped; it never ends the scan.
//! - FIFOs, sockets and character devices are never opened (opening a FIFO
//!   blocks): they are reported as skipped special files.
//! - Pieces start at a multiple of the piece size from the start of their
//!   data extent, so a non-sparse file read in full is cut exactly like
//!   `data.chunks(piece)`.

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// One file or block device to read.
#[derive(Debug)]
pub struct Input {
    pub path: PathBuf,
    pub block_device: bool,
    /// Logical size (holes included).
    pub size: u64,
    /// Data extents (offset, length), holes excluded.
    pub extents: Vec<(u64, u64)>,
}

impl Input {
    pub fn data_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.1).sum()
    }
}

/// What the walk and the reads met, for the report.
#[derive(Debug, Default, serde::Serialize)]
pub struct WalkStats {
    pub files: u64,
    pub block_devices: u64,
    pub directories: u64,
    pub special_skipped: u64,
    pub symlinks_skipped: u64,
    pub unreadable: u64,
    /// The first messages (all of them went to stderr).
    pub errors: Vec<String>,
}

const ERRORS_KEPT: usize = 100;

impl WalkStats {
    /// Reports a problem on stderr and keeps it for the report.
    pub fn problem(&mut self, msg: String) {
        eprintln!("squeeze scan: {msg}");
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push(msg);
        }
    }

    /// Counts `path` as unreadable and reports why ("cannot {what} ...").
    pub fn unreadable(&mut self, path: &Path, what: &str, e: &dyn std::fmt::Display) {
        self.unreadable += 1;
        self.problem(format!("cannot {what} {}: {e} (skipped)", path.display()));
    }
}

/// Walks `paths`: command-line paths are followed if they are symlinks,
/// symlinks met inside directories are not. Entries are visited in name
/// order, so the same tree gives the same inputs.
pub fn walk(paths: &[PathBuf], st: &mut WalkStats) -> Vec<Input> {
    let mut out = Vec::new();
    for p in paths {
        match fs::metadata(p) {
            Ok(md) => visit(p, &md, st, &mut out),
            Err(e) => st.unreadable(p, "read", &e),
        }
    }
    out
}

fn visit(path: &Path, md: &fs::Metadata, st: &mut WalkStats, out: &mut Vec<Input>) {
    let ft = md.file_type();
    if ft.is_dir() {
        st.directories += 1;
        let rd = match fs::read_dir(path) {
            Ok(rd) => rd,
            Err(e) => return st.unreadable(path, "list directory", &e),
        };
        let mut entries: Vec<PathBuf> = Vec::new();
        for ent in rd {
            match ent {
                Ok(ent) => entries.push(ent.path()),
                Err(e) => return st.unreadable(path, "list directory", &e),
            }
        }
        entries.sort();
        for p in entries {
            match fs::symlink_metadata(&p) {
                Ok(md) if md.file_type().is_symlink() => st.symlinks_skipped += 1,
                Ok(md) => visit(&p, &md, st, out),
                Err(e) => st.unreadable(&p, "read", &e),
            }
        }
    } else if ft.is_file() || ft.is_block_device() {
        match open_input(path, ft.is_block_device()) {
            Ok(input) => {
                if input.block_device {
                    st.block_devices += 1;
                } else {
                    st.files += 1;
                }
                out.push(input);
            }
            Err(e) => st.unreadable(path, "open", &e),
        }
    } else {
        st.special_skipped += 1;
        let kind = if ft.is_fifo() {
            "FIFO"
        } else if ft.is_socket() {
            "socket"
        } else if ft.is_char_device() {
            "character device"
        } else {
            "special file"
        };
        st.problem(format!("skipping {kind} {}", path.display()));
    }
}

fn open_input(path: &Path, block_device: bool) -> std::io::Result<Input> {
    let f = File::open(path)?;
    let size = if block_device {
        // SAFETY: lseek on a descriptor we own; no memory is involved.
        let end = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
        if end < 0 {
            return Err(std::io::Error::last_os_error());
        }
        end as u64
    } else {
        f.metadata()?.len()
    };
    let extents = if block_device {
        whole(size)
    } else {
        data_extents(&f, size)
    };
    Ok(Input {
        path: path.to_path_buf(),
        block_device,
        size,
        extents,
    })
}

fn whole(size: u64) -> Vec<(u64, u64)> {
    if size == 0 {
        Vec::new()
    } else {
        vec![(0, size)]
    }
}

/// The data extents of `f` by SEEK_DATA/SEEK_HOLE; the whole file when the
/// file system does not support them.
fn data_extents(f: &File, size: u64) -> Vec<(u64, u64)> {
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut off: u64 = 0;
    while off < size {
        // SAFETY: lseek on a descriptor we own; no memory is involved.
        let data = unsafe { libc::lseek(fd, off as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return whole(size);
        }
        let data = data as u64;
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        let hole = if hole < 0 {
            size
        } else {
            (hole as u64).min(size)
        };
        if hole <= data {
            break;
        }
        // Adjacent extents are one: should a file system answer a hole of
        // no length between two extents, pieces must not start anew there
        // (the blobs would not be those of the file laid end to end).
        match out.last_mut() {
            Some((s, l)) if *s + *l == data => *l += hole - data,
            _ => out.push((data, hole - data)),
        }
        off = hole;
    }
    out
}

/// Pieces to read per input, as (offset, length). `budget`: bytes to
/// sample, spread evenly over all data (`None`, or data no larger than the
/// budget: everything).
pub fn plan(inputs: &[Input], budget: Option<u64>, piece: u64) -> Vec<Vec<(u64, u64)>> {
    let total: u64 = inputs.iter().map(Input::data_bytes).sum();
    let full = match budget {
        None => true,
        Some(b) => total <= b,
    };
    if full {
        return inputs
            .iter()
            .map(|inp| {
                let mut v = Vec::new();
                for &(start, len) in &inp.extents {
                    let mut o = 0;
                    while o < len {
                        v.push((start + o, piece.min(len - o)));
                        o += piece;
                    }
                }
                v
            })
            .collect();
    }
    let n = (budget.unwrap_or(0) / piece).max(1);
    let mut out: Vec<Vec<(u64, u64)>> = inputs.iter().map(|_| Vec::new()).collect();
    // Global data positions k * total / n, mapped to (input, extent).
    let mut k = 0u64;
    let mut base = 0u64; // global position of the current extent's start
    'inputs: for (i, inp) in inputs.iter().enumerate() {
        for &(start, len) in &inp.extents {
            loop {
                if k >= n {
                    break 'inputs;
                }
                let g = (u128::from(k) * u128::from(total) / u128::from(n)) as u64;
                if g >= base + len {
                    break;
                }
                let within = (g - base) / piece * piece;
                let p = (start + within, piece.min(len - within));
                if out[i].last() != Some(&p) {
                    out[i].push(p);
                }
                k += 1;
            }
            base += len;
        }
    }
    out
}

/// Reads up to `len` bytes at `off` (short at the end of a file that
/// shrank since the walk).
pub fn read_at(f: &File, off: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(extents: Vec<(u64, u64)>) -> Input {
        Input {
            path: PathBuf::from("x"),
            block_device: false,
            size: extents.iter().map(|e| e.0 + e.1).max().unwrap_or(0),
            extents,
        }
    }

    #[test]
    fn full_plan_cuts_like_chunks() {
        let ins = [input(vec![(0, 300)]), input(vec![(0, 100), (1000, 50)])];
        let p = plan(&ins, None, 128);
        assert_eq!(p[0], vec![(0, 128), (128, 128), (256, 44)]);
        assert_eq!(p[1], vec![(0, 100), (1000, 50)]);
        // Budget larger than the data: everything.
        assert_eq!(plan(&ins, Some(1 << 20), 128), p);
    }

    #[test]
    fn sampled_plan_spreads_pieces() {
        let ins = [input(vec![(0, 1 << 20)]), input(vec![(0, 1 << 20)])];
        let p = plan(&ins, Some(4 * 4096), 4096);
        let all: Vec<_> = p.iter().flatten().collect();
        assert_eq!(all.len(), 4);
        assert_eq!(p[0], vec![(0, 4096), (512 << 10, 4096)]);
        assert_eq!(p[1], vec![(0, 4096), (512 << 10, 4096)]);
    }
}
