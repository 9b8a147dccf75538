//! The one adapter between the NBD layer (which knows nothing of
//! compression) and the engine (which knows nothing of sockets): the
//! engine's Volume as squeeze-nbd's BlockDevice.

use squeeze_engine::{EngineError, Volume};
use squeeze_nbd::BlockDevice;
use std::io;
use std::sync::Arc;

/// The engine volume as an NBD block device.
pub struct VolumeDevice {
    pub vol: Volume,
}

fn io_err(e: EngineError) -> io::Error {
    e.into_io()
}

impl VolumeDevice {
    /// Hands every write answered so far to the backing file, not durably
    /// (`Volume::write_out`): a kill of this process no longer loses them.
    pub fn write_out(&self) -> io::Result<()> {
        self.vol.write_out().map_err(io_err)
    }
}

impl BlockDevice for VolumeDevice {
    fn size(&self) -> u64 {
        self.vol.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.vol.read(offset, buf).map_err(io_err)
    }
    fn read_or_hole(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        // One map walk for the read and the hole test.
        self.vol.read_or_hole(offset, buf).map_err(io_err)
    }
    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<bool>> {
        self.vol
            .try_read_cached(offset, buf)
            .map_err(io_err)
            .transpose()
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.vol.write(offset, data, fua).map_err(io_err)
    }
    fn write_owned(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        // No copy for the compression engine: the payload becomes its input.
        let data = Arc::new(data);
        self.vol
            .write_shared(offset, &data, 0..data.len(), fua)
            .map_err(io_err)
    }
    fn flush(&self) -> io::Result<()> {
        self.vol.flush().map_err(io_err)
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.vol.trim(offset, len, fua).map_err(io_err)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()> {
        if may_trim {
            // Zeros are free (DESIGN principle 4): whole zero sectors become
            // holes and read back as zeros.
            self.vol.write_zeroes(offset, len, fua).map_err(io_err)
        } else {
            // NO_HOLE: the range must stay provisioned, which on a
            // compressing thin volume means mapped to records like written
            // data (zeros compress to almost nothing); BLOCK_STATUS then
            // reports it allocated, not a hole.
            self.vol
                .write_zeroes_no_hole(offset, len, fua)
                .map_err(io_err)
        }
    }
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.vol.block_status(offset, len, 4096).map_err(io_err)
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn can_fast_zero(&self) -> bool {
        true
    }
    fn max_concurrent_writes(&self) -> usize {
        volume_write_slots()
    }
}

/// WRITE requests a compressing volume runs at once: two per core, at
/// least 4. Writes are CPU-bound (the codec), and on 2 cores 4 wrote fio's
/// W1 at 1168-1298 MB/s where 8 managed 920-1211; reads, which mostly
/// wait for the device, keep every NBD worker.
pub(super) fn volume_write_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 2).clamp(4, 64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::create_volume;
    use squeeze_engine::CreateOptions;
    use squeeze_nbd::{Export, Server, ServerConfig};

    /// A served volume declares the compressing write limit, and the NBD
    /// server's write slots are that, unless --write-workers overrides it.
    #[test]
    fn volumes_declare_the_write_slots_the_server_uses() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        assert_eq!(volume_write_slots(), (cores * 2).clamp(4, 64));
        let dir = std::env::temp_dir().join(format!("sqz-serve-slots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sqz");
        let _ = std::fs::remove_file(&path);
        let vol = create_volume(&path, &CreateOptions::new(1 << 20)).unwrap();
        let dev = Arc::new(VolumeDevice { vol });
        assert_eq!(dev.max_concurrent_writes(), volume_write_slots());
        let export = |d: &Arc<VolumeDevice>| Export {
            name: "v".into(),
            description: String::new(),
            device: d.clone() as Arc<dyn BlockDevice>,
        };
        let server = Server::with_config(vec![export(&dev)], ServerConfig::default()).unwrap();
        assert_eq!(server.write_slots(), volume_write_slots());
        drop(server);
        let config = ServerConfig {
            write_workers: Some(2),
            ..ServerConfig::default()
        };
        let server = Server::with_config(vec![export(&dev)], config).unwrap();
        assert_eq!(server.write_slots(), 2);
        drop(server);
        drop(dev);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
