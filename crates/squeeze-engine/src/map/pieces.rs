//! The pieces of the checkpoint chain that hold a chunk's runs: what a
//! chunk paged out is read back from (`page_in`, `meta::pager`).
//!
//! Invariants: at most [`PIECES_MAX`] pieces, in chain order, no piece
//! twice in a row; past that the chunk is untracked (it stays in memory
//! until a checkpoint writes it whole).

/// Most pieces of the checkpoint chain a chunk's runs may be spread over
/// and still be paged out (reading it back reads each of them).
pub const PIECES_MAX: usize = 6;

/// The pieces of the current checkpoint chain that hold runs of a chunk, in
/// chain order: applied in that order to an empty chunk, their runs inside
/// the chunk rebuild it as the last checkpoint saw it. A chunk spread over
/// more than [`PIECES_MAX`] pieces is untracked (it stays in memory until
/// a checkpoint rewrites it whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pieces {
    n: u8,
    at: [u16; PIECES_MAX],
}

impl Pieces {
    const UNTRACKED: u8 = u8::MAX;

    /// In no piece yet (a chunk mapped since the last checkpoint: dirty).
    pub(super) fn none() -> Pieces {
        Pieces {
            n: 0,
            at: [0; PIECES_MAX],
        }
    }

    pub(super) fn untracked() -> Pieces {
        Pieces {
            n: Self::UNTRACKED,
            at: [0; PIECES_MAX],
        }
    }

    /// Only in the piece `k` (a base, or a delta that covered all of it).
    pub(super) fn only(k: u16) -> Pieces {
        let mut p = Pieces::none();
        p.add(k);
        p
    }

    pub(super) fn add(&mut self, k: u16) {
        let n = usize::from(self.n);
        if self.n == Self::UNTRACKED || (n > 0 && self.at[n - 1] == k) {
            return;
        }
        if n == PIECES_MAX {
            *self = Pieces::untracked();
            return;
        }
        self.at[n] = k;
        self.n += 1;
    }

    /// The pieces, or None when untracked.
    pub(super) fn list(&self) -> Option<&[u16]> {
        (self.n != Self::UNTRACKED).then(|| &self.at[..usize::from(self.n)])
    }
}
