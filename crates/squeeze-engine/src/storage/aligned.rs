//! A zeroed heap buffer aligned for direct I/O (`BLOCK` bytes): what the
//! write-behind pool stages in and what the file's direct reads and writes
//! bounce through. It owns its allocation as a `Box<[u8]>` would.

use std::alloc::{self, Layout};

/// Alignment of direct I/O: offsets, lengths and buffers.
pub const BLOCK: usize = 4096;

/// A zeroed, `BLOCK`-aligned heap buffer.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only hand out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        assert!(len > 0 && len.is_multiple_of(BLOCK));
        let layout = Layout::from_size_align(len, BLOCK).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BLOCK).expect("valid layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { alloc::dealloc(self.ptr, layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
