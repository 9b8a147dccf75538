//! The log: create and open (recovery), group commit, truncation.
//!
//! Group commit: `append` queues its record and waits. Whoever finds no
//! group in progress becomes the leader: it takes the queued records (up
//! to `GROUP_BYTES_MAX` and `GROUP_RECORDS_MAX`), gives them seqs and
//! positions, writes them with one volume write per contiguous run (two if
//! the group wraps), flushes once, and wakes everyone. Records queued meanwhile form the next group.
//!
//! Invariants:
//! - a group is written and flushed before the next one is written, so
//!   only the last group can be incomplete after a crash;
//! - seqs are given out by the leader to records it places, so they stay
//!   consecutive even when a record is refused (`Full`);
//! - the live log (header start to tail, whole sectors) never spans more
//!   than the record area, so a write never lands on a live sector;
//! - queued bytes are bounded (`QUEUE_BYTES_MAX`): appenders wait;
//! - after a failed write or flush the log refuses everything until it is
//!   reopened (it cannot know what reached the medium), except a group
//!   whose single write the volume refused for space (nothing was
//!   written): its records fail with the volume's ENOSPC and the log goes on;
//! - v2: the first record an open writes stores the epoch, and every record
//!   after it in that open implies it (`record_v2`); `epochs` knows the
//!   epoch of every live record, so a truncation can name the new start's.

use crate::error::{Result, WalError};
use crate::header::Header;
use crate::record::{RecordHeader, PAYLOAD_MAX, RECORD_HEADER_BYTES};
pub use crate::record_v2::GROUP_RECORDS_MAX;
use crate::record_v2::{self, RecordHeaderV2};
use crate::recovery::{self, End};
use crate::{Layout, Lsn, RecordVersion};
use parking_lot::{Condvar, Mutex};
use squeeze_engine::{EngineError, Volume};
use squeeze_format::SECTOR_SIZE;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

const SECTOR: u64 = SECTOR_SIZE as u64;
/// Most record bytes one commit group carries.
pub const GROUP_BYTES_MAX: usize = 1 << 20;
/// Most record bytes waiting for a group.
pub const QUEUE_BYTES_MAX: usize = 8 << 20;
const _: () = assert!(PAYLOAD_MAX + RECORD_HEADER_BYTES <= QUEUE_BYTES_MAX);
/// Queued and grouped records are counted with v1's header, the longest.
const _: () = assert!(record_v2::HEADER_BYTES_MAX <= RECORD_HEADER_BYTES);

/// Counters of one open log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records committed.
    pub records: u64,
    /// Commit groups written (one volume flush each).
    pub groups: u64,
    /// Record bytes committed (headers and payloads).
    pub record_bytes: u64,
    /// Bytes handed to the volume (whole sectors, tail rewrites included).
    pub volume_bytes: u64,
}

enum Outcome {
    Done(Lsn),
    /// The volume had no room for the group's first write: nothing of it
    /// was written, and the log goes on.
    NoSpace(EngineError),
    Full(String),
    Failed(String),
}

struct Queued {
    ticket: u64,
    payload: Vec<u8>,
}

struct State {
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    next_ticket: u64,
    done: HashMap<u64, Outcome>,
    leading: bool,
    /// Seq of the next record placed.
    next_seq: u64,
    /// Position after the last committed record.
    tail: u64,
    /// Dense: the bytes of the tail's sector before the tail.
    tail_image: Vec<u8>,
    /// The header's start (the first live record).
    head: Lsn,
    /// (seq, epoch): the live records from seq on, up to the next entry's,
    /// are of that epoch. Never empty; the last entry is the epoch of the
    /// last record written (or, before any, the header's start epoch).
    epochs: Vec<(u64, u32)>,
    failed: Option<String>,
    stats: WalStats,
}

/// An open log. Safe for many concurrent appenders.
pub struct Wal {
    vol: Arc<Volume>,
    /// The header as opened: layout, id, epoch and area never change while
    /// the log is open (the leader reads them without a lock).
    fixed: Header,
    /// The header as on disk: its start moves with truncation, which holds
    /// this lock (as does `read_all`, so it never reads a trimmed prefix).
    header: Mutex<Header>,
    state: Mutex<State>,
    wake: Condvar,
}

impl Wal {
    /// Creates a log on `vol`, which must be empty (no mapped sector), with
    /// version 2 records.
    pub fn create(vol: Arc<Volume>, layout: Layout) -> Result<Wal> {
        Wal::create_with(vol, layout, RecordVersion::V2)
    }

    /// Creates a log with the record version `version`: V1 only to make the
    /// logs of earlier releases (tests, and a before/after benchmark).
    pub fn create_with(vol: Arc<Volume>, layout: Layout, version: RecordVersion) -> Result<Wal> {
        let size = vol.size();
        if size < 2 * SECTOR {
            return Err(WalError::Invalid(format!(
                "a volume of {size} bytes has no room for a log"
            )));
        }
        let runs = vol.block_status(0, size, 2)?;
        if runs.iter().any(|&(_, hole)| !hole) {
            return Err(WalError::Invalid(
                "the volume is not empty (a log is created on an empty volume only)".into(),
            ));
        }
        let h = Header {
            version,
            layout,
            log_id: rand::random::<u64>() | 1,
            epoch: 1,
            area_start: SECTOR,
            area_bytes: (size / SECTOR - 1) * SECTOR,
            start_pos: 0,
            start_seq: 0,
            start_epoch: 0,
        };
        vol.write(0, &h.encode(), true)?;
        Ok(Wal::with(
            vol,
            h,
            End {
                pos: 0,
                seq: 0,
                epoch: 0,
            },
            Vec::new(),
            vec![(0, 0)],
        ))
    }

    /// Opens the log on `vol`: reads the header (refusing anything that is
    /// not a log, or a log of another layout when `expect` names one),
    /// finds the end, calls `each` for every live record in order, starts
    /// a new epoch (durable before it returns).
    pub fn open(
        vol: Arc<Volume>,
        expect: Option<Layout>,
        each: impl FnMut(Lsn, &[u8]),
    ) -> Result<Wal> {
        let mut h = read_header(&vol)?;
        if let Some(wanted) = expect {
            if wanted != h.layout {
                return Err(WalError::LayoutMismatch {
                    found: h.layout,
                    wanted,
                });
            }
        }
        if h.area_start + h.area_bytes > vol.size() {
            return Err(WalError::Corrupt(format!(
                "the record area ends at {} beyond the volume's {} bytes",
                h.area_start + h.area_bytes,
                vol.size()
            )));
        }
        let mut each = each;
        let mut epochs = vec![(h.start_seq, h.start_epoch)];
        let end = recovery::scan(&vol, &h, |lsn, epoch, p| {
            if epochs.last().expect("never empty").1 != epoch {
                epochs.push((lsn.seq, epoch));
            }
            each(lsn, p)
        })?;
        let mut image = Vec::new();
        if h.layout == Layout::Dense && !end.pos.is_multiple_of(SECTOR) {
            let start = end.pos / SECTOR * SECTOR;
            image = vec![0u8; (end.pos - start) as usize];
            vol.read(h.area_start + start % h.area_bytes, &mut image)?;
        }
        h.epoch = h
            .epoch
            .checked_add(1)
            .ok_or_else(|| WalError::Corrupt("epoch overflow".into()))?;
        vol.write(0, &h.encode(), true)?;
        Ok(Wal::with(vol, h, end, image, epochs))
    }

    fn with(
        vol: Arc<Volume>,
        h: Header,
        end: End,
        tail_image: Vec<u8>,
        epochs: Vec<(u64, u32)>,
    ) -> Wal {
        Wal {
            vol,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                queued_bytes: 0,
                next_ticket: 0,
                done: HashMap::new(),
                leading: false,
                next_seq: end.seq,
                tail: end.pos,
                tail_image,
                head: Lsn {
                    seq: h.start_seq,
                    pos: h.start_pos,
                },
                epochs,
                failed: None,
                stats: WalStats::default(),
            }),
            fixed: h,
            header: Mutex::new(h),
            wake: Condvar::new(),
        }
    }

    pub fn layout(&self) -> Layout {
        self.fixed.layout
    }

    /// The log's record version (its header's).
    pub fn version(&self) -> RecordVersion {
        self.fixed.version
    }

    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    pub fn stats(&self) -> WalStats {
        self.state.lock().stats
    }

    /// The first live record's place and the place the next record gets.
    pub fn bounds(&self) -> (Lsn, Lsn) {
        let st = self.state.lock();
        (
            st.head,
            Lsn {
                seq: st.next_seq,
                pos: st.tail,
            },
        )
    }

    /// Appends a record and returns once it is durable.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn> {
        if payload.len() > PAYLOAD_MAX {
            return Err(WalError::TooLarge {
                len: payload.len(),
                max: PAYLOAD_MAX,
            });
        }
        let mut st = self.state.lock();
        while st.queued_bytes > QUEUE_BYTES_MAX && st.failed.is_none() {
            self.wake.wait(&mut st);
        }
        if let Some(why) = &st.failed {
            return Err(WalError::Failed(why.clone()));
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queued_bytes += RECORD_HEADER_BYTES + payload.len();
        st.queue.push_back(Queued {
            ticket,
            payload: payload.to_vec(),
        });
        loop {
            if let Some(o) = st.done.remove(&ticket) {
                return match o {
                    Outcome::Done(lsn) => Ok(lsn),
                    Outcome::NoSpace(e) => Err(WalError::Volume(e)),
                    Outcome::Full(why) => Err(WalError::Full(why)),
                    Outcome::Failed(why) => Err(WalError::Failed(why)),
                };
            }
            if !st.leading {
                st.leading = true;
                self.lead(&mut st);
                st.leading = false;
                self.wake.notify_all();
                continue;
            }
            self.wake.wait(&mut st);
        }
    }

    /// Takes a group off the queue, writes and flushes it (without the
    /// state lock), and records the outcome of each record.
    fn lead(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        let mut group = Vec::new();
        let mut bytes = 0;
        while let Some(q) = st.queue.front() {
            let n = RECORD_HEADER_BYTES + q.payload.len();
            if !group.is_empty()
                && (bytes + n > GROUP_BYTES_MAX || group.len() == GROUP_RECORDS_MAX)
            {
                break;
            }
            bytes += n;
            group.push(st.queue.pop_front().expect("front"));
        }
        st.queued_bytes -= bytes;
        if let Some(why) = st.failed.clone() {
            for q in group {
                st.done.insert(q.ticket, Outcome::Failed(why.clone()));
            }
            return;
        }
        let h = self.fixed;
        let plan = plan_group(&h, st, &group);
        let written = parking_lot::MutexGuard::unlocked(st, || self.write_runs(&h, &plan));
        match written {
            Ok(()) => {
                if let Some((_, first)) = plan.placed.first() {
                    if st.epochs.last().expect("never empty").1 != h.epoch {
                        st.epochs.push((first.seq, h.epoch));
                    }
                }
                st.next_seq += plan.placed.len() as u64;
                st.tail = plan.tail;
                st.tail_image = plan.tail_image;
                st.stats.groups += u64::from(!plan.placed.is_empty());
                st.stats.records += plan.placed.len() as u64;
                st.stats.record_bytes += plan.record_bytes;
                st.stats.volume_bytes += plan.runs.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
                for (ticket, lsn) in plan.placed {
                    st.done.insert(ticket, Outcome::Done(lsn));
                }
            }
            Err((first_run, e)) => {
                let why = e.to_string();
                let no_space = match e {
                    WalError::Volume(e @ EngineError::NoSpace(_)) if first_run => Some(e),
                    _ => None,
                };
                if no_space.is_none() {
                    st.failed = Some(why.clone());
                }
                for (ticket, _) in plan.placed {
                    let o = match &no_space {
                        Some(e) => Outcome::NoSpace(e.duplicate()),
                        None => Outcome::Failed(why.clone()),
                    };
                    st.done.insert(ticket, o);
                }
            }
        }
        for (ticket, why) in plan.refused {
            st.done.insert(ticket, Outcome::Full(why));
        }
    }

    /// Writes the runs of a group and flushes; on failure says whether it
    /// was the first write (nothing of the group written before it).
    fn write_runs(&self, h: &Header, plan: &Plan) -> Result<(), (bool, WalError)> {
        for (k, (off, buf)) in plan.runs.iter().enumerate() {
            self.vol
                .write(h.area_start + off, buf, false)
                .map_err(|e| (k == 0, e.into()))?;
        }
        if !plan.runs.is_empty() {
            self.vol.flush().map_err(|e| (false, e.into()))?;
        }
        Ok(())
    }

    /// Drops the records before `lsn` (consumed): the header moves its
    /// start there (durable first), then the whole sectors before it are
    /// trimmed so the volume gives their space back. `lsn` must be a
    /// committed record's place, or the place the next record gets.
    /// Returns the bytes trimmed.
    pub fn truncate(&self, lsn: Lsn) -> Result<u64> {
        let mut h = self.header.lock();
        let (head, next) = {
            let st = self.state.lock();
            if let Some(why) = &st.failed {
                return Err(WalError::Failed(why.clone()));
            }
            (
                st.head,
                Lsn {
                    seq: st.next_seq,
                    pos: st.tail,
                },
            )
        };
        if lsn.seq < head.seq || lsn.seq > next.seq {
            return Err(WalError::Invalid(format!(
                "truncate to seq {}: the log holds seqs {}..{}",
                lsn.seq, head.seq, next.seq
            )));
        }
        // The epoch of the record at `lsn`: of the next record if it is the
        // tail (which this open writes).
        let epoch = if lsn == next {
            self.fixed.epoch
        } else {
            self.epoch_of(lsn.seq)
        };
        let start_epoch = match h.version {
            RecordVersion::V1 => 0,
            RecordVersion::V2 => epoch,
        };
        if lsn != next {
            let mut ok = false;
            let probe = Header {
                start_pos: lsn.pos,
                start_seq: lsn.seq,
                start_epoch,
                ..*h
            };
            if lsn.pos >= head.pos && lsn.pos < next.pos {
                ok = recovery::record_is_at(&self.vol, &probe, lsn, epoch)?;
            }
            if !ok {
                return Err(WalError::Invalid(format!(
                    "truncate: no record {} at log position {}",
                    lsn.seq, lsn.pos
                )));
            }
        }
        let new = Header {
            start_pos: lsn.pos,
            start_seq: lsn.seq,
            start_epoch,
            ..*h
        };
        self.vol.write(0, &new.encode(), true)?;
        *h = new;
        {
            let mut st = self.state.lock();
            st.head = lsn;
            // Keep the entry that covers the new start, and the ones after.
            let keep = st.epochs.partition_point(|&(s, _)| s <= lsn.seq).max(1) - 1;
            st.epochs.drain(..keep);
        }
        // Whole sectors before the new start's sector: nothing live is in them.
        let from = head.pos / SECTOR * SECTOR;
        let to = lsn.pos / SECTOR * SECTOR;
        let mut at = from;
        while at < to {
            let off = at % h.area_bytes;
            let n = (to - at).min(h.area_bytes - off);
            self.vol.trim(h.area_start + off, n, false)?;
            at += n;
        }
        Ok(to.saturating_sub(from))
    }

    /// The epoch of committed record `seq` (live).
    fn epoch_of(&self, seq: u64) -> u32 {
        let st = self.state.lock();
        let i = st.epochs.partition_point(|&(s, _)| s <= seq);
        st.epochs[i.max(1) - 1].1
    }

    /// Calls `each` for every live record, in order (a consumer's read).
    pub fn read_all(&self, each: impl FnMut(Lsn, &[u8])) -> Result<()> {
        let h = self.header.lock();
        let (_, next) = self.bounds();
        let mut each = each;
        recovery::scan(&self.vol, &h, |lsn, _, p| {
            if lsn.seq < next.seq {
                each(lsn, p)
            }
        })?;
        Ok(())
    }
}

/// Reads and checks the header of the log on `vol`.
pub fn read_header(vol: &Volume) -> Result<Header> {
    let mut b = vec![0u8; SECTOR_SIZE];
    vol.read(0, &mut b)?;
    Header::decode(&b)
}

/// A group laid out: the volume writes, and each record's place.
struct Plan {
    /// (area offset, whole sectors).
    runs: Vec<(u64, Vec<u8>)>,
    placed: Vec<(u64, Lsn)>,
    refused: Vec<(u64, String)>,
    tail: u64,
    tail_image: Vec<u8>,
    record_bytes: u64,
}

fn plan_group(h: &Header, st: &State, group: &[Queued]) -> Plan {
    let mut pos = st.tail;
    let mut image = st.tail_image.clone();
    if h.layout == Layout::Sparse && !pos.is_multiple_of(SECTOR) {
        pos = pos.next_multiple_of(SECTOR);
        image.clear();
    }
    let head_floor = st.head.pos / SECTOR * SECTOR;
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut cur: Option<(u64, Vec<u8>)> = None;
    let mut placed = Vec::new();
    let mut refused = Vec::new();
    let mut record_bytes = 0;
    let mut seq = st.next_seq;
    // v2: the first record this open writes stores the epoch.
    let mut store_epoch = st.epochs.last().expect("never empty").1 != h.epoch;
    for q in group {
        if !refused.is_empty() {
            refused.push((
                q.ticket,
                "an earlier record of its group did not fit".into(),
            ));
            continue;
        }
        let len = q.payload.len() as u32;
        let v2 = RecordHeaderV2::new(len, seq, h.epoch, seq == st.next_seq, store_epoch);
        let n = match h.version {
            RecordVersion::V1 => (RECORD_HEADER_BYTES + q.payload.len()) as u64,
            RecordVersion::V2 => v2.record_bytes(),
        };
        let mut at = pos;
        if at % h.area_bytes + n > h.area_bytes {
            at = at.next_multiple_of(h.area_bytes);
        }
        if (at + n).next_multiple_of(SECTOR) - head_floor > h.area_bytes {
            refused.push((
                q.ticket,
                format!(
                    "{} live bytes from seq {} leave no room for {n} more in an area of {}",
                    pos - st.head.pos,
                    st.head.seq,
                    h.area_bytes
                ),
            ));
            continue;
        }
        if at != pos || cur.is_none() {
            if let Some(run) = cur.take() {
                runs.push(run);
            }
            if at != pos {
                image.clear();
            }
            let start = at / SECTOR * SECTOR;
            let mut buf = Vec::with_capacity(GROUP_BYTES_MAX);
            buf.extend_from_slice(&image[..(at - start) as usize]);
            cur = Some((start % h.area_bytes, buf));
        }
        let buf = &mut cur.as_mut().expect("a run").1;
        match h.version {
            RecordVersion::V1 => RecordHeader {
                log_id: h.log_id,
                seq,
                group: st.next_seq,
                epoch: h.epoch,
                len,
            }
            .encode_into(&q.payload, buf),
            RecordVersion::V2 => v2.encode_into(h.log_id, seq, h.epoch, &q.payload, buf),
        }
        store_epoch = false;
        placed.push((q.ticket, Lsn { seq, pos: at }));
        seq += 1;
        record_bytes += n;
        pos = at + n;
    }
    if let Some(run) = cur.take() {
        runs.push(run);
    }
    let tail_image = match runs.last() {
        Some((_, buf)) if h.layout == Layout::Dense => {
            let whole = buf.len() / SECTOR_SIZE * SECTOR_SIZE;
            buf[whole..].to_vec()
        }
        _ => Vec::new(),
    };
    for (_, buf) in runs.iter_mut() {
        buf.resize(buf.len().next_multiple_of(SECTOR_SIZE), 0);
    }
    Plan {
        runs,
        placed,
        refused,
        tail: if record_bytes > 0 { pos } else { st.tail },
        tail_image: if record_bytes > 0 {
            tail_image
        } else {
            st.tail_image.clone()
        },
        record_bytes,
    }
}
