//! A dense chunk's entries ([`CHUNK_ENTRIES`] of them, one per sector) in
//! 5 bytes each while they allow it, else in 8 (issue 37 item 4).
//!
//! A chunk turns dense after scattered single-sector writes (squeeze-kv's
//! buckets: each bucket is its own one-sector record, so nearly every entry
//! is its own run). Such an entry needs only its record's offset and
//! length: index 0 of 1 sector. **Narrow** holds an entry in 40 bits, the
//! record's offset in 16-byte units (31 bits: records in the first 32 GiB
//! of the backing file) and its length in 16-byte units (9 bits: up to
//! 8176 bytes, more than a sector's record with its header needs), or 0
//! for an unmapped sector: 2560 bytes a chunk instead of 4096. **Wide** is
//! the plain 8-byte [`MapEntry`]; a chunk turns wide, for as long as it
//! stays resident, when it gets an entry narrow cannot hold (a blob's
//! sector, an indirect entry, a record past 32 GiB). The map is RAM: the
//! checkpoint chain's runs and every lookup see the same [`MapEntry`]
//! either way.
//!
//! Invariants: narrow's 40-bit value is 0 exactly for an unmapped sector;
//! `get(i)` after `set(i, e)` is `e`, in either form.

use squeeze_format::{MapEntry, CHUNK_ENTRIES};

/// Bytes of a narrow entry.
const NARROW_BYTES: usize = 5;
/// Bits of a narrow entry's length (in 16-byte units).
const LEN_BITS: u32 = 9;
/// Bits of a narrow entry's offset (in 16-byte units).
const OFFSET_BITS: u32 = 8 * NARROW_BYTES as u32 - LEN_BITS;
/// A `MapEntry`'s low 40 bits: the record's offset in 16-byte units.
const ENTRY_OFFSET_MASK: u64 = (1 << 40) - 1;
/// A `MapEntry`'s index and sector-count bits (40..50): 0 for index 0 of
/// a one-sector record.
const ENTRY_SHAPE_MASK: u64 = 0x3ff << 40;
/// Where a `MapEntry` keeps its length in 16-byte units.
const ENTRY_LEN_SHIFT: u32 = 50;

const _: () = assert!(OFFSET_BITS == 31 && OFFSET_BITS + LEN_BITS == 40);

/// The narrow form of `e`, if it has one.
fn narrow(e: MapEntry) -> Option<u64> {
    if !e.is_mapped() {
        return Some(0);
    }
    let len16 = e.0 >> ENTRY_LEN_SHIFT; // 0 for an indirect entry
    let off16 = e.0 & ENTRY_OFFSET_MASK;
    let fits = e.0 & ENTRY_SHAPE_MASK == 0
        && (1..1 << LEN_BITS).contains(&len16)
        && off16 < 1 << OFFSET_BITS;
    fits.then_some((off16 << LEN_BITS) | len16)
}

/// The entry a narrow value holds.
fn widen(v: u64) -> MapEntry {
    if v == 0 {
        return MapEntry::UNMAPPED;
    }
    MapEntry((v >> LEN_BITS) | ((v & ((1 << LEN_BITS) - 1)) << ENTRY_LEN_SHIFT))
}

pub(super) enum DenseEntries {
    Narrow(Box<[u8; CHUNK_ENTRIES * NARROW_BYTES]>),
    Wide(Box<[MapEntry; CHUNK_ENTRIES]>),
}

impl DenseEntries {
    /// Every sector unmapped.
    pub(super) fn unmapped() -> DenseEntries {
        DenseEntries::Narrow(Box::new([0; CHUNK_ENTRIES * NARROW_BYTES]))
    }

    /// `entries`, narrow when every one of them has a narrow form.
    pub(super) fn from_array(entries: Box<[MapEntry; CHUNK_ENTRIES]>) -> DenseEntries {
        let mut n = Box::new([0; CHUNK_ENTRIES * NARROW_BYTES]);
        for (i, &e) in entries.iter().enumerate() {
            match narrow(e) {
                Some(v) => put(&mut n, i, v),
                None => return DenseEntries::Wide(entries),
            }
        }
        DenseEntries::Narrow(n)
    }

    pub(super) fn get(&self, i: u16) -> MapEntry {
        match self {
            DenseEntries::Narrow(n) => widen(load(n, usize::from(i))),
            DenseEntries::Wide(w) => w[usize::from(i)],
        }
    }

    /// Sets entry `i`, returning the old one; turns wide when `e` has no
    /// narrow form.
    pub(super) fn set(&mut self, i: u16, e: MapEntry) -> MapEntry {
        let i = usize::from(i);
        if let DenseEntries::Narrow(n) = self {
            let old = widen(load(n, i));
            if let Some(v) = narrow(e) {
                put(n, i, v);
                return old;
            }
            *self = DenseEntries::Wide(self.to_array());
        }
        match self {
            DenseEntries::Wide(w) => std::mem::replace(&mut w[i], e),
            DenseEntries::Narrow(_) => unreachable!("turned wide above"),
        }
    }

    /// Entries `i..i + out.len()`.
    pub(super) fn get_range(&self, i: u16, out: &mut [MapEntry]) {
        let i = usize::from(i);
        match self {
            DenseEntries::Narrow(n) => {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = widen(load(n, i + j));
                }
            }
            DenseEntries::Wide(w) => out.copy_from_slice(&w[i..i + out.len()]),
        }
    }

    /// All entries, 8 bytes each.
    pub(super) fn to_array(&self) -> Box<[MapEntry; CHUNK_ENTRIES]> {
        match self {
            DenseEntries::Narrow(_) => {
                let mut a = Box::new([MapEntry::UNMAPPED; CHUNK_ENTRIES]);
                self.get_range(0, &mut a[..]);
                a
            }
            DenseEntries::Wide(w) => w.clone(),
        }
    }

    /// Calls `f` with all entries as one slice (decoded onto the stack
    /// when narrow).
    pub(super) fn with_slice<R>(&self, f: impl FnOnce(&[MapEntry]) -> R) -> R {
        match self {
            DenseEntries::Narrow(_) => {
                let mut a = [MapEntry::UNMAPPED; CHUNK_ENTRIES];
                self.get_range(0, &mut a);
                f(&a)
            }
            DenseEntries::Wide(w) => f(&w[..]),
        }
    }

    /// The first mapped sector at or after `start`.
    pub(super) fn first_mapped(&self, start: u16) -> Option<u16> {
        (start..CHUNK_ENTRIES as u16).find(|&i| self.get(i).is_mapped())
    }

    /// Heap bytes of the entries.
    pub(super) fn memory_bytes(&self) -> usize {
        match self {
            DenseEntries::Narrow(_) => CHUNK_ENTRIES * NARROW_BYTES,
            DenseEntries::Wide(_) => CHUNK_ENTRIES * std::mem::size_of::<MapEntry>(),
        }
    }

    #[cfg(test)]
    pub(super) fn is_narrow(&self) -> bool {
        matches!(self, DenseEntries::Narrow(_))
    }
}

fn load(n: &[u8; CHUNK_ENTRIES * NARROW_BYTES], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..NARROW_BYTES].copy_from_slice(&n[i * NARROW_BYTES..(i + 1) * NARROW_BYTES]);
    u64::from_le_bytes(b)
}

fn put(n: &mut [u8; CHUNK_ENTRIES * NARROW_BYTES], i: usize, v: u64) {
    debug_assert!(v < 1 << (8 * NARROW_BYTES));
    n[i * NARROW_BYTES..(i + 1) * NARROW_BYTES].copy_from_slice(&v.to_le_bytes()[..NARROW_BYTES]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use squeeze_format::{SHARED_BASE, SHARED_SECTORS};

    /// An entry of one of the shapes a map holds, narrow-able or not.
    fn any_entry(r: &mut impl Rng) -> MapEntry {
        match r.gen_range(0..8) {
            0 => MapEntry::UNMAPPED,
            1 => MapEntry::indirect(SHARED_BASE + r.gen_range(0..SHARED_SECTORS)),
            2 => {
                let n = r.gen_range(2..=32u32);
                MapEntry::new(
                    16 * r.gen_range(1..1u64 << 31),
                    r.gen_range(0..n),
                    n,
                    16 * 900,
                )
            }
            // Past 32 GiB, or longer than narrow's 9 bits.
            3 => MapEntry::new(16 << 31, 0, 1, 4160),
            4 => MapEntry::new(1 << 20, 0, 1, 16 * 512),
            // What a squeeze-kv bucket is: one sector, up to 8176 bytes,
            // in the first 32 GiB.
            _ => MapEntry::new(
                16 * r.gen_range(1..1u64 << 31),
                0,
                1,
                16 * r.gen_range(1..512u64),
            ),
        }
    }

    #[test]
    fn narrow_holds_exactly_single_sector_records_in_32_gib() {
        assert_eq!(narrow(MapEntry::UNMAPPED), Some(0));
        for e in [
            MapEntry::new(16, 0, 1, 16),
            MapEntry::new((16 << 31) - 16, 0, 1, 16 * 511),
            MapEntry::new(1 << 30, 0, 1, 4160),
        ] {
            let v = narrow(e).expect("narrow");
            assert!(v != 0 && v < 1 << 40);
            assert_eq!(widen(v), e);
        }
        for e in [
            MapEntry::new(16 << 31, 0, 1, 4160),
            MapEntry::new(1 << 20, 0, 1, 16 * 512),
            MapEntry::new(1 << 20, 0, 2, 8192),
            MapEntry::new(1 << 20, 1, 2, 8192),
            MapEntry::indirect(SHARED_BASE),
        ] {
            assert_eq!(narrow(e), None, "{e:?}");
        }
    }

    /// Random sets against a plain array: every entry reads back, in
    /// both forms, and the chunk turns wide only for an entry that needs it.
    #[test]
    fn matches_an_array() {
        let mut r = rand::rngs::StdRng::seed_from_u64(27);
        for round in 0..200 {
            let mut d = DenseEntries::unmapped();
            let mut model = Box::new([MapEntry::UNMAPPED; CHUNK_ENTRIES]);
            let mut wide_needed = false;
            for _ in 0..r.gen_range(1..2000) {
                let i = r.gen_range(0..CHUNK_ENTRIES);
                let e = if round % 2 == 0 {
                    any_entry(&mut r)
                } else {
                    // Mostly narrow-able: chunks that stay narrow.
                    MapEntry::new(16 * r.gen_range(1..1u64 << 31), 0, 1, 4160)
                };
                wide_needed |= narrow(e).is_none();
                assert_eq!(d.set(i as u16, e), model[i]);
                model[i] = e;
                assert_eq!(d.is_narrow(), !wide_needed);
            }
            for i in 0..CHUNK_ENTRIES {
                assert_eq!(d.get(i as u16), model[i]);
            }
            assert_eq!(d.to_array(), model);
            d.with_slice(|s| assert_eq!(s, &model[..]));
            let (a, n) = (r.gen_range(0..CHUNK_ENTRIES), r.gen_range(0..64));
            let n = n.min(CHUNK_ENTRIES - a);
            let mut out = vec![MapEntry::UNMAPPED; n];
            d.get_range(a as u16, &mut out);
            assert_eq!(out, &model[a..a + n]);
            let s = r.gen_range(0..CHUNK_ENTRIES as u16);
            let want = (s..CHUNK_ENTRIES as u16).find(|&i| model[usize::from(i)].is_mapped());
            assert_eq!(d.first_mapped(s), want);
            let again = DenseEntries::from_array(model.clone());
            assert_eq!(
                again.is_narrow(),
                model.iter().all(|&e| narrow(e).is_some())
            );
            assert_eq!(again.to_array(), model);
        }
    }

    #[test]
    fn narrow_costs_five_bytes_a_sector() {
        let mut d = DenseEntries::unmapped();
        d.set(3, MapEntry::new(1 << 30, 0, 1, 4160));
        assert_eq!(d.memory_bytes(), 2560);
        d.set(4, MapEntry::new(1 << 20, 0, 2, 8192));
        assert_eq!(d.memory_bytes(), 4096);
        assert_eq!(d.get(3), MapEntry::new(1 << 30, 0, 1, 4160));
    }
}
